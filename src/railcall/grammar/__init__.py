"""Grammars: the IR (`ir`), its front ends (`tools` for tool tables, `schema` for JSON Schema),
and the byte machine they compile to (`program`)."""
