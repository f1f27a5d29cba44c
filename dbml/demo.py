"""``python -m dbml demo [database]``: dbml end to end, in SQL, on data generated locally.

Every step is a SQL statement printed before its result, so the demo doubles as a
tutorial. The tables are generated inside DuckDB from hashes of the row number; the
images are PNG files drawn here by a seeded generator into a temporary folder and read
with DuckDB's ``read_blob``. The same on every run and machine; nothing is downloaded.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

import dbml

# uniform(i, k): a deterministic pseudo-random number in [0, 1) for row i and stream k.
UNIFORM = "CREATE OR REPLACE TEMP MACRO uniform(i, k) AS (hash(i, k) % 1000000) / 1000000.0"
NORMAL = ("CREATE OR REPLACE TEMP MACRO normal(i, k) AS "
          "sqrt(-2 * ln(uniform(i, k) + 1e-9)) * cos(2 * pi() * uniform(i, k + 100))")

DATA = [
    ("Two interleaving half moons (classification)", """
CREATE OR REPLACE TABLE moons AS
SELECT CASE WHEN label = 0 THEN cos(t) ELSE 1 - cos(t) END + 0.1 * normal(i, 3) AS x1,
       CASE WHEN label = 0 THEN sin(t) ELSE 0.5 - sin(t) END + 0.1 * normal(i, 4) AS x2,
       label, CASE WHEN uniform(i, 5) < 0.8 THEN 'train' ELSE 'test' END AS split
FROM (SELECT range AS i, (uniform(range, 1) < 0.5)::INTEGER AS label, pi() * uniform(range, 2) AS t
      FROM range(4000))"""),
    ("Customers who churn or stay (numeric, categorical and missing values)", """
CREATE OR REPLACE TABLE customers AS
SELECT i AS customer_id, tenure, monthly_charges, contract, payment, has_support,
       uniform(i, 20) < 1 / (1 + exp(-(1.5 - 0.08 * coalesce(tenure, 24) + 0.03 * (monthly_charges - 70)
           + CASE contract WHEN 'month-to-month' THEN 1.2 WHEN 'one year' THEN -0.5 ELSE -1.5 END
           - CASE WHEN has_support THEN 0.8 ELSE 0 END))) AS churned,
       CASE WHEN uniform(i, 21) < 0.8 THEN 'train' ELSE 'test' END AS split
FROM (SELECT range AS i,
             CASE WHEN uniform(range, 10) < 0.03 THEN NULL ELSE floor(72 * uniform(range, 11)) END AS tenure,
             round(20 + 100 * uniform(range, 12), 2) AS monthly_charges,
             ['month-to-month', 'one year', 'two year'][1 + floor(3 * uniform(range, 13))::INTEGER] AS contract,
             ['card', 'transfer', 'check'][1 + floor(3 * uniform(range, 14))::INTEGER] AS payment,
             uniform(range, 15) < 0.4 AS has_support
      FROM range(10000))"""),
    ("House prices (regression)", """
CREATE OR REPLACE TABLE houses AS
SELECT size_m2, rooms, age_years, district,
       1000 * (50 + 2.5 * size_m2 + 8 * rooms - 0.6 * age_years
               + CASE district WHEN 'centre' THEN 120 WHEN 'river' THEN 60 ELSE 0 END
               + 10 * normal(i, 35)) AS price,
       CASE WHEN uniform(i, 36) < 0.8 THEN 'train' ELSE 'test' END AS split
FROM (SELECT range AS i, 30 + 170 * uniform(range, 31) AS size_m2, 1 + floor(6 * uniform(range, 32)) AS rooms,
             floor(80 * uniform(range, 33)) AS age_years,
             ['centre', 'river', 'suburb'][1 + floor(3 * uniform(range, 34))::INTEGER] AS district
      FROM range(5000))"""),
    ("Support tickets: ten words each, two name the queue, some carry a word of another queue", """
CREATE OR REPLACE TABLE tickets AS
SELECT i AS ticket_id, queues[q] AS queue,
       array_to_string(list_transform(range(10), lambda j: CASE
           WHEN j IN (a, b) THEN topics[q][1 + floor(5 * uniform(i, 60 + j))::INTEGER]
           WHEN j = c THEN topics[1 + (q - 1 + other) % 4][1 + floor(5 * uniform(i, 60 + j))::INTEGER]
           ELSE filler[1 + floor(len(filler) * uniform(i, 60 + j))::INTEGER] END), ' ') AS body,
       CASE WHEN uniform(i, 59) < 0.8 THEN 'train' ELSE 'test' END AS split
FROM (SELECT range AS i, 1 + floor(4 * uniform(range, 50))::INTEGER AS q,
             floor(10 * uniform(range, 51))::INTEGER AS a, floor(10 * uniform(range, 52))::INTEGER AS b,
             CASE WHEN uniform(range, 53) < 0.3 THEN floor(10 * uniform(range, 54))::INTEGER END AS c,
             1 + floor(3 * uniform(range, 55))::INTEGER AS other
      FROM range(1500)),
     (SELECT ['billing', 'technical', 'shipping', 'account'] AS queues,
             [['invoice', 'refund', 'charged', 'payment', 'receipt'], ['error', 'crash', 'install', 'slow', 'bug'],
              ['delivery', 'parcel', 'courier', 'tracking', 'delayed'],
              ['password', 'login', 'email', 'username', 'locked']] AS topics,
             ['hello', 'please', 'my', 'the', 'i', 'have', 'a', 'question', 'about', 'since', 'yesterday', 'again',
              'thanks', 'help', 'urgent', 'can', 'you', 'check', 'it', 'is', 'not', 'ok'] AS filler)"""),
]

TRAIN = [
    ("One statement trains two models: a linear baseline and an MLP", """
SELECT t.model, t.version, t.rows, round(t.final_loss, 4) AS final_loss,
       round(t.val_metric, 3) AS val_accuracy, round(t.seconds, 1) AS seconds
FROM (SELECT train(name, 'SELECT x1, x2, label FROM moons WHERE split = ''train''',
                   label := 'label', arch := arch, epochs := 20) AS t
      FROM (VALUES ('moons_linear', 'linear'), ('moons_mlp', 'mlp')) AS v(name, arch))"""),
    ("Churn: categorical features are one-hot encoded, NULLs imputed", """
SELECT t.model, t.rows, round(t.val_metric, 3) AS val_accuracy, round(t.seconds, 1) AS seconds
FROM (SELECT train('churn', 'SELECT * EXCLUDE (customer_id, split) FROM customers WHERE split = ''train''',
                   label := 'churned', hidden := [32, 16], epochs := 10, batch_size := 128) AS t)"""),
    ("House prices: linear regression", """
SELECT t.model, t.rows, round(t.val_metric, 4) AS val_r2, round(t.seconds, 1) AS seconds
FROM (SELECT train('house_price', 'SELECT * EXCLUDE (split) FROM houses WHERE split = ''train''',
                   label := 'price', arch := 'linear', epochs := 15, lr := 0.05) AS t)"""),
]

# The statements are shown as they run: written out in full, both models with the same arguments;
# train() returns the job's small result, dbml_jobs holds its memory figures.
MEMORY = [
    ("The same MLP trained by plain PyTorch, then by the TENSILE scheduler at 90% of PyTorch's peak", """
SELECT t.model, t.job_id, t.val_metric, round(t.seconds, 1) AS seconds
FROM (SELECT train('wide_eager', 'SELECT x1, x2, label FROM moons WHERE split = ''train''',
                   label := 'label', hidden := [256, 256], batch_size := 256, epochs := 3, policy := 'eager') AS t);
SELECT t.model, t.job_id, t.val_metric, round(t.seconds, 1) AS seconds
FROM (SELECT train('wide_tensile', 'SELECT x1, x2, label FROM moons WHERE split = ''train''',
                   label := 'label', hidden := [256, 256], batch_size := 256, epochs := 3, measure_vanilla := true,
                   memory_budget := (SELECT (0.9 * vanilla_peak_bytes)::BIGINT FROM dbml_jobs
                                     WHERE model = 'wide_eager')) AS t);
SELECT model, measured_peak_bytes, vanilla_peak_bytes, round(msr, 3) AS msr, swaps, recomputes,
       round(seconds, 1) AS seconds
FROM dbml_jobs WHERE model IN ('wide_eager', 'wide_tensile') ORDER BY job_id"""),
    ("Scheduling never changes results: the weights are identical, bit for bit", """
SELECT (SELECT weights FROM dbml_weights WHERE name = 'wide_eager')
     = (SELECT weights FROM dbml_weights WHERE name = 'wide_tensile') AS identical_weights"""),
]

# Shapes drawn into PNG files: the class is the shape; position, size, stroke and
# brightness vary, and Gaussian noise covers every pixel.
SHAPES = ("circle", "square", "triangle", "cross")
IMAGE_SIZE, IMAGES_PER_SHAPE, NOISE, SEED = 20, 300, 45.0, 11

# PNG_FOLDER stands for the temporary folder the PNG files are written to. A step may
# hold two statements (split at ';'): each is printed, then its result. The transformer
# trains without dropout, so that the demo prints the same numbers on every run.
DEEP = [
    ("Images: PNG files read by DuckDB's read_blob; the label comes from the file name <shape>_<n>.png", """
CREATE OR REPLACE TABLE shapes AS
SELECT parse_filename(filename) AS file, content AS image, split_part(file, '_', 1) AS shape,
       split_part(parse_filename(filename, true), '_', 2)::INTEGER AS n,
       CASE WHEN n % 5 = 0 THEN 'test' ELSE 'train' END AS split
FROM read_blob('PNG_FOLDER/*.png');
SELECT shape, count(*) FILTER (split = 'train') AS train, count(*) FILTER (split = 'test') AS test,
       round(avg(octet_length(image))) AS avg_png_bytes
FROM shapes GROUP BY shape ORDER BY shape"""),
    ("A small convolutional network on the images (decoded by Pillow, grey, 20x20)", """
SELECT t.model, t.rows, round(t.val_metric, 3) AS val_accuracy, round(t.seconds, 1) AS seconds
FROM (SELECT train('shapes_cnn', 'SELECT image, shape FROM shapes WHERE split = ''train''', label := 'shape',
                   arch := 'cnn', options := '{"width": 16}', epochs := 8, batch_size := 64) AS t)"""),
    ("The CNN on the held-out images, and a few of its predictions", """
SELECT round(m.accuracy, 3) AS accuracy, round(m.macro_f1, 3) AS macro_f1, m.rows
FROM (SELECT evaluate('shapes_cnn', 'SELECT * FROM shapes WHERE split = ''test''') AS m);
SELECT file, shape, prediction
FROM predictions('shapes_cnn', 'SELECT * FROM shapes WHERE split = ''test''') ORDER BY n LIMIT 6"""),
    ("Text: a transformer reads the ticket bodies (tokenised by dbml, the vocabulary stored with the model)", """
SELECT t.model, t.rows, round(t.val_metric, 3) AS val_accuracy, round(t.seconds, 1) AS seconds
FROM (SELECT train('tickets', 'SELECT body, queue FROM tickets WHERE split = ''train''', label := 'queue',
                   arch := 'transformer', options := '{"width": 32, "depth": 1, "heads": 2, "ff": 64, "dropout": 0}',
                   epochs := 10, batch_size := 64) AS t)"""),
    ("The transformer on the held-out tickets, and a few of its predictions", """
SELECT round(m.accuracy, 3) AS accuracy, round(m.macro_f1, 3) AS macro_f1, m.rows
FROM (SELECT evaluate('tickets', 'SELECT * FROM tickets WHERE split = ''test''') AS m);
SELECT ticket_id, body, queue, prediction
FROM predictions('tickets', 'SELECT * FROM tickets WHERE split = ''test''') ORDER BY ticket_id LIMIT 5"""),
]


def write_shapes(folder: Path) -> None:
    """IMAGES_PER_SHAPE grey PNG files per shape in ``folder``, named ``<shape>_<n>.png``."""
    rng = np.random.default_rng(SEED)
    for n in range(IMAGES_PER_SHAPE * len(SHAPES)):
        shape = SHAPES[n % len(SHAPES)]
        image = Image.new("L", (IMAGE_SIZE, IMAGE_SIZE), 0)
        radius = rng.uniform(0.2, 0.4) * IMAGE_SIZE
        x, y = rng.uniform(radius + 1, IMAGE_SIZE - radius - 1, 2)
        _draw(ImageDraw.Draw(image), shape, x, y, radius, ink=int(rng.integers(90, 200)),
              stroke=int(rng.integers(1, 3)))
        pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, NOISE, (IMAGE_SIZE, IMAGE_SIZE))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{shape}_{n}.png")


def _draw(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, *, ink: int, stroke: int) -> None:
    """The outline of ``shape`` centred at (x, y) with half-size r."""
    if shape == "circle":
        draw.ellipse((x - r, y - r, x + r, y + r), outline=ink, width=stroke)
    elif shape == "square":
        draw.rectangle((x - r, y - r, x + r, y + r), outline=ink, width=stroke)
    elif shape == "triangle":
        draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], outline=ink, width=stroke)
    else:
        draw.line((x - r, y, x + r, y), fill=ink, width=stroke)
        draw.line((x, y - r, x, y + r), fill=ink, width=stroke)


USE = [
    ("Scalar predict() over raw numeric features", """
SELECT round(x1, 3) AS x1, round(x2, 3) AS x2, label,
       predict('moons_mlp', [x1, x2]) AS mlp, predict('moons_linear', [x1, x2]) AS linear
FROM moons WHERE split = 'test' LIMIT 5"""),
    ("The table form predicts from a model's features by name, categorical ones too", """
SELECT customer_id, tenure, contract, has_support, churned, prediction
FROM predictions('churn', 'SELECT * FROM customers WHERE split = ''test''') LIMIT 5"""),
    ("Evaluation on the held-out test rows", """
SELECT name, round(m.accuracy, 3) AS accuracy, round(m.macro_f1, 3) AS macro_f1,
       round(m.log_loss, 3) AS log_loss, round(m.r2, 4) AS r2, round(m.rmse, 1) AS rmse
FROM (SELECT name, evaluate(name, source) AS m FROM (VALUES
        ('moons_linear', 'SELECT * FROM moons WHERE split = ''test'''),
        ('moons_mlp', 'SELECT * FROM moons WHERE split = ''test'''),
        ('churn', 'SELECT * FROM customers WHERE split = ''test'''),
        ('house_price', 'SELECT * FROM houses WHERE split = ''test''')) AS v(name, source))"""),
    ("The catalog", "SELECT name, version, arch, task, features, rows, bytes FROM dbml_models ORDER BY name"),
]


def main(database: str = ":memory:") -> int:
    started = time.perf_counter()
    con = dbml.connect(database)
    con.execute(UNIFORM)
    con.execute(NORMAL)
    print(f"dbml demo — DuckDB database: {database}\n")
    for title, sql in DATA:
        con.execute(sql)
        name = sql.split("TABLE ")[1].split()[0]
        rows = con.table(name).count("*").fetchall()[0][0]
        print(f"• {title}: table {name}, {rows} rows")
    for section, steps in (("Training", TRAIN), ("Memory", MEMORY)):
        run_section(con, section, steps)
    # The PNG files only need to live until read_blob has copied them into the table.
    with tempfile.TemporaryDirectory(prefix="dbml-demo-") as folder:
        write_shapes(Path(folder))
        run_section(con, "Images and text", [(title, sql.replace("PNG_FOLDER", Path(folder).as_posix()))
                                             for title, sql in DEEP])
    run_section(con, "Using the models", USE)
    print(report(con, time.perf_counter() - started))
    con.close()
    return 0


def run_section(con, section: str, steps: list[tuple[str, str]]) -> None:
    """Print each step's statements (a step may hold several, split at ';'), each followed by its result."""
    print(f"\n== {section} ==")
    for title, sql in steps:
        print(f"\n-- {title}")
        for statement in sql.split(";\n"):
            print(f"{statement.strip()};")
            result = con.sql(statement)
            if result is not None:
                print(result)


TEST_ACCURACY = ("SELECT evaluate(name, 'SELECT * FROM ' || source || ' WHERE split = ''test''').accuracy "
                 "FROM (VALUES ('shapes_cnn', 'shapes'), ('tickets', 'tickets')) AS v(name, source)")


def report(con, seconds: float) -> str:
    """The closing line: what was trained and how well, from the catalog and the test rows."""
    models, mlp, r2, msr = con.execute("""
        SELECT count(*), max(val) FILTER (name = 'moons_mlp'), max(val) FILTER (name = 'house_price'),
               max((metrics->'memory'->>'msr')::DOUBLE) FILTER (name = 'wide_tensile')
        FROM (SELECT name, metrics, (metrics->>'val_metric')::DOUBLE AS val FROM dbml_models)""").fetchall()[0]
    (cnn,), (text,) = con.execute(TEST_ACCURACY).fetchall()
    return (f"\nReport: {models} models trained in SQL; moons MLP validation accuracy {mlp:.3f}; house-price "
            f"validation R² {r2:.4f}; shapes CNN test accuracy {cnn:.3f}; ticket transformer test accuracy "
            f"{text:.3f}; the scheduler cut the wide MLP's peak memory by {100 * msr:.0f}% with identical "
            f"weights; whole demo {seconds:.1f} s.")
