-- dbml quickstart: python -m dbml shell demo.duckdb < demo/quickstart.sql
CREATE OR REPLACE TABLE moons AS
SELECT CASE WHEN label = 0 THEN cos(t) ELSE 1 - cos(t) END + 0.1 * (hash(i, 3) % 1000 / 1000.0 - 0.5) AS x1,
       CASE WHEN label = 0 THEN sin(t) ELSE 0.5 - sin(t) END + 0.1 * (hash(i, 4) % 1000 / 1000.0 - 0.5) AS x2,
       label,
       CASE WHEN hash(i, 5) % 10 < 8 THEN 'train' ELSE 'test' END AS split
FROM (SELECT range AS i, (hash(range, 1) % 2)::INTEGER AS label, pi() * (hash(range, 2) % 1000) / 1000.0 AS t
      FROM range(4000));

SELECT train('moons_mlp', 'SELECT x1, x2, label FROM moons WHERE split = ''train''', label := 'label');

SELECT x1, x2, label, predict('moons_mlp', [x1, x2]) AS p FROM moons LIMIT 5;

SELECT evaluate('moons_mlp', 'SELECT * FROM moons WHERE split = ''test''');

SELECT name, version, arch, task, rows, bytes FROM dbml_models;

SELECT drop_model('moons_mlp');
