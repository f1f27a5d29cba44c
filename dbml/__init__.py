"""dbml — in-database machine learning for DuckDB."""
