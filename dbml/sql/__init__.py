"""SQL files that dbml.install() applies to a connection, in name order."""
