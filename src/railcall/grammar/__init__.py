"""Grammars: the IR (`ir`), its front ends (`tools` for tool tables, `schema` for JSON Schema,
`lark`, `gbnf` and `cfg.regex_grammar` for general grammars over text, through `cfg`), and the
byte machine they compile to (`program`)."""
