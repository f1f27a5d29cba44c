-- Scratch space for training jobs: each job's encoded rows, readable from any cursor of
-- the instance (unlike TEMP tables), dropped when the job ends, and gone with the process.
ATTACH IF NOT EXISTS ':memory:' AS dbml_scratch;
