"""The SQL surface of dbml: thin UDFs that parse arguments, call dbml and shape results."""
