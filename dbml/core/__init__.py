"""The core: the job, its data path, the catalog and inference (imports no backend or surface)."""
