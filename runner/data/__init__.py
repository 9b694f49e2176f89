"""The training text: documents read and checked without torch (`corpus`), and global batches from (seed, step) (`batches`)."""
