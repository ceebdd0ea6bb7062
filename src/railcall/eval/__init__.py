"""Evaluation on real function-calling data (BFCL) and the grammar ablation.

    bfcl.py     the BFCL files -> Tasks (questions, tools, gold answers); the evaluation prompt
    checker.py  parse (wire format), schema validity, BFCL's AST checker rules
    runner.py   each task on the model with and without the grammar, batched; JSON lines, resume
    report.py   summary.json, the terminal table, the chart
    ablation.py parse rate with and without the grammar on the demo tool table
"""
