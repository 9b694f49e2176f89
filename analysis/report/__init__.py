"""report.md: its answer and one module per section, and the document that puts them together."""
