"""Deep-learning data path and eager overhead (issue 11): images, resnet18 and transformer.

    python benchmarks/bench_deep.py [--quick] [--workers N]

In one run, on data generated into a temporary folder (32x32 RGB PNGs of random shapes on
noise, the label the shape; token sequences of length 64 whose class sets their tokens):

1. Image rows per second into training batches of 64, alternating A B A B over rounds:
   * dbml: the PNG BLOBs read by DuckDB (``read_blob``) into a table stored as a job
     materialises it (``SELECT image AS x, label AS y ... ORDER BY hash``), then one epoch
     of ``dbml.core.data.BatchStream`` as ``training._run_epochs`` builds it (two queries from a
     random starting row, shuffle window, prefetch 4), with the fitted image encoder's
     ``to_tensor`` as ``convert`` (Pillow decoding on dbml's pool of ``DECODE_WORKERS``
     threads, normalisation). Timed: from the stream's start to its last batch.
   * a plain PyTorch ``DataLoader`` (map-style Dataset opening the same files from disk with
     Pillow, same normalisation, ``shuffle=True``, ``num_workers`` = dbml's decode workers,
     workers not persistent: the default). Timed: from ``iter(loader)`` to its last batch.
2. The share of each epoch spent waiting on data for ``resnet18`` on those 32x32 images at
   batch 64, from ``train(..., policy := 'eager')``'s ``dbml_epochs`` view.
3. Per-epoch seconds of ``train(..., policy := 'eager')`` against a hand-written PyTorch loop
   over tensors already decoded in memory (the same model from ``dbml.zoo.build`` under the
   same seed, Adam at the same lr, batch 64, a fresh permutation per epoch, the same torch
   thread count: train's ``torch_threads`` setting, 1). Rounds alternate: one train() of E
   epochs, then E hand epochs; the first epoch of every run is warm-up and left out.
Medians throughout; the load average before and after is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

import dbml
import dbml.core.inputs
from dbml.core.data import BatchStream
from dbml.core.source import Column
from dbml.zoo import Inputs, build as zoo_build

THREADS = 1          # train()'s torch_threads setting, left at its default
BATCH = 64
SEED = 0
LR = 1e-3
CLASSES = 3          # image labels: 0 rectangle, 1 ellipse, 2 line
SEQ_LEN, VOCAB = 64, 1000

# 4 DataLoader workers on 2 cores: torch warns; the count is the comparison's (dbml's decode pool).
warnings.filterwarnings("ignore", message="This DataLoader will create")


@dataclass
class Size:
    images: int          # PNG files for part 1 (and the first `train_images` for parts 2-3)
    image_rounds: int
    train_images: int
    resnet_width: float
    resnet_epochs: int
    resnet_rounds: int
    sequences: int
    seq_epochs: int
    seq_rounds: int


QUICK = Size(images=2000, image_rounds=3, train_images=512, resnet_width=0.25, resnet_epochs=3, resnet_rounds=1,
             sequences=1024, seq_epochs=3, seq_rounds=1)
FULL = Size(images=5000, image_rounds=5, train_images=512, resnet_width=0.25, resnet_epochs=3, resnet_rounds=4,
            sequences=1024, seq_epochs=3, seq_rounds=4)


# -- data -------------------------------------------------------------------------------------
def write_pngs(folder: str, n: int, rng: np.random.Generator) -> None:
    """``n`` 32x32 RGB PNGs: uniform noise, one random shape on top; the label in the name."""
    for i in range(n):
        label = int(rng.integers(CLASSES))
        noise = rng.integers(0, 96, size=(32, 32, 3), dtype=np.uint8)
        image = Image.fromarray(noise, "RGB")
        draw = ImageDraw.Draw(image)
        x0, y0 = (int(v) for v in rng.integers(0, 14, 2))
        x1, y1 = (int(v) for v in rng.integers(18, 32, 2))
        colour = tuple(int(v) for v in rng.integers(128, 256, 3))
        [draw.rectangle, draw.ellipse, draw.line][label]((x0, y0, x1, y1), fill=colour)
        image.save(os.path.join(folder, f"{i:05d}_{label}.png"))


def load_images(con, folder: str, n_train: int) -> None:
    """``imgs``: every PNG as a BLOB with its label; ``imgs_train``: the first ``n_train``."""
    con.execute(f"""CREATE TABLE imgs AS SELECT content AS image,
                    regexp_extract(filename, '_(\\d+)\\.png$', 1)::INTEGER AS label, filename
                    FROM read_blob('{folder}/*.png') ORDER BY filename""")
    con.execute(f"CREATE TABLE imgs_train AS SELECT image, label FROM imgs ORDER BY filename LIMIT {n_train}")


def load_sequences(con, n: int, rng: np.random.Generator) -> None:
    """``seqs(tokens INTEGER[64], label)``: class c draws most tokens from its own tenth of the vocabulary."""
    labels = rng.integers(CLASSES, size=n)
    own = labels[:, None] * (VOCAB // 10) + rng.integers(VOCAB // 10, size=(n, SEQ_LEN))
    tokens = np.where(rng.random((n, SEQ_LEN)) < 0.5, own, rng.integers(VOCAB, size=(n, SEQ_LEN)))
    tokens[0, 0] = VOCAB - 1   # the largest id present, so dbml's vocabulary is VOCAB + 1 ids
    table = pa.table({"tokens": pa.array(tokens.tolist(), type=pa.list_(pa.int32())),
                      "label": pa.array(labels, type=pa.int32())})
    con.register("seqs_arrow", table)
    con.execute("CREATE TABLE seqs AS SELECT tokens::INTEGER[] AS tokens, label FROM seqs_arrow")
    con.unregister("seqs_arrow")


# -- 1. image rows per second -------------------------------------------------------------------
def materialise_images(con) -> tuple[dbml.core.inputs.InputEncoder, int]:
    """The image table as a train() job stores it, and the encoder train() would fit on it."""
    enc = dbml.core.inputs.fit(con, "imgs", Column("image", "BLOB"), "image", image_size=None, shape=None)
    con.execute(f"""CREATE TABLE job_imgs AS SELECT x, y, false AS is_val FROM
                    (SELECT image AS x, label::BIGINT AS y, hash(image, label, {SEED}) AS h FROM imgs) ORDER BY h""")
    return enc, con.execute("SELECT count(*) FROM job_imgs").fetchall()[0][0]


def dbml_image_epoch(con, enc, n_rows: int, epoch: int) -> float:
    """Rows per second of one epoch of the batch stream training runs (``training._run_epochs``)."""
    rng = np.random.default_rng([SEED, epoch])
    start = int(rng.integers(n_rows))
    sql = [f"SELECT x, y FROM job_imgs WHERE NOT is_val AND rowid >= {start}",
           f"SELECT x, y FROM job_imgs WHERE NOT is_val AND rowid < {start}"]
    t0 = time.perf_counter()
    stream = BatchStream(con, sql, BATCH, 4, shuffle=int(rng.integers(2**63)), window_rows=65536,
                         convert=lambda col: enc.to_tensor(col)).start()
    rows = sum(len(y) for _, y in stream)
    seconds = time.perf_counter() - t0
    assert rows == n_rows, (rows, n_rows)
    return rows / seconds


class PNGFiles(torch.utils.data.Dataset):
    """The plain PyTorch way: one file opened with Pillow per item, normalised like dbml's encoder."""

    def __init__(self, paths: list[str], mean, std):
        self.paths = paths
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        path = self.paths[i]
        with Image.open(path) as image:
            a = np.asarray(image.convert("RGB"), dtype=np.uint8).transpose(2, 0, 1)
        x = (a.astype(np.float32) / 255.0 - self.mean) / self.std
        return torch.from_numpy(x), int(path[-5])


def dataloader_epoch(dataset: PNGFiles, workers: int, epoch: int) -> float:
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                                         generator=torch.Generator().manual_seed(epoch))
    t0 = time.perf_counter()
    rows = sum(len(y) for _, y in loader)
    seconds = time.perf_counter() - t0
    assert rows == len(dataset)
    return rows / seconds


def bench_images(con, folder: str, size: Size, workers: int) -> dict:
    enc, n = materialise_images(con)
    paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    dataset = PNGFiles(paths, enc.mean, enc.std)
    ours, theirs = [], []
    for r in range(size.image_rounds):             # A B A B ...
        ours.append(dbml_image_epoch(con, enc, n, r))
        theirs.append(dataloader_epoch(dataset, workers, r))
        print(f"  round {r + 1}: dbml {ours[-1]:8.0f} rows/s   DataLoader {theirs[-1]:8.0f} rows/s", flush=True)
    return {"dbml": ours, "baseline": theirs}


# -- 2. and 3. train() against a hand-written loop ----------------------------------------------
def dbml_epochs(con, name: str, table: str, arch: str, options: dict, epochs: int) -> list[tuple[float, float]]:
    """(seconds, data wait seconds) of every epoch of one eager train() from SQL."""
    torch.set_num_threads(THREADS)
    result = con.sql(f"""SELECT train('{name}', '{table}', label := 'label', arch := '{arch}',
                         options := '{json.dumps(options)}', epochs := {epochs}, batch_size := {BATCH},
                         lr := {LR}, seed := {SEED}, validation := 0, task := 'classification',
                         policy := 'eager')""").fetchall()[0][0]
    if result["status"] != "done" and result.get("error"):
        raise RuntimeError(f"train() failed: {result['error']}")
    return con.sql(f"SELECT seconds, data_wait_seconds FROM dbml_epochs WHERE model = '{name}' "
                   f"ORDER BY version DESC, epoch").fetchall()[:epochs]


def hand_epochs(x: torch.Tensor, y: torch.Tensor, arch: str, inputs: Inputs, options: dict,
                epochs: int) -> list[float]:
    """Seconds of every epoch of the textbook loop over in-memory tensors."""
    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    model = zoo_build(arch, inputs, CLASSES, options)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(SEED)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(len(y), generator=generator)
        for i in range(0, len(y), BATCH):
            batch = order[i:i + BATCH]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
        times.append(time.perf_counter() - t0)
    return times


def bench_training(con, label: str, table: str, arch: str, inputs: Inputs, options: dict, x, y,
                   epochs: int, rounds: int) -> dict:
    """Rounds of one train() of E epochs, then E hand epochs. Besides wall seconds per epoch and
    each round's ratio of medians, the process CPU seconds of each whole run per epoch (train():
    with its setup and its producer and decode threads; the hand loop: its epochs)."""
    out = {k: [] for k in ("dbml", "baseline", "wait_share", "round_ratio", "dbml_cpu", "baseline_cpu")}
    for r in range(rounds):
        cpu = time.process_time()
        run = dbml_epochs(con, f"bench_{arch}_{r}", table, arch, options, epochs)
        out["dbml_cpu"].append((time.process_time() - cpu) / epochs)
        cpu = time.process_time()
        hand = hand_epochs(x, y, arch, inputs, options, epochs)
        out["baseline_cpu"].append((time.process_time() - cpu) / epochs)
        for e, ((s, w), h) in enumerate(zip(run, hand)):
            print(f"  {label} round {r + 1} epoch {e + 1}: train() {s:6.2f} s (data wait {w:5.3f} s, "
                  f"{100 * w / s:4.1f} %)   hand loop {h:6.2f} s", flush=True)
        out["dbml"] += [s for s, _ in run[1:]]
        out["wait_share"] += [w / s for s, w in run[1:]]
        out["baseline"] += hand[1:]
        out["round_ratio"].append(median(s for s, _ in run[1:]) / median(hand[1:]))
        print(f"  {label} round {r + 1}: ratio of medians {out['round_ratio'][-1]:.3f}x; process CPU s per epoch "
              f"(whole runs) train() {out['dbml_cpu'][-1]:.2f}, hand loop {out['baseline_cpu'][-1]:.2f}", flush=True)
    return out


def decoded_images(con, enc) -> tuple[torch.Tensor, torch.Tensor]:
    table = con.sql("SELECT image, label::BIGINT FROM imgs_train").to_arrow_table()
    return enc.to_tensor(table.column(0)), torch.from_numpy(table.column(1).to_numpy())


def decoded_sequences(con) -> tuple[torch.Tensor, torch.Tensor]:
    table = con.sql("SELECT tokens, label::BIGINT FROM seqs").to_arrow_table()
    tokens = np.asarray(table.column(0).to_pylist(), dtype=np.int64) + 1     # 0 pads, as dbml shifts ids
    return torch.from_numpy(tokens), torch.from_numpy(table.column(1).to_numpy())


# -- report -------------------------------------------------------------------------------------
def median(values) -> float:
    return statistics.median(values)


def table(rows: list[tuple]) -> None:
    print(f"\n{'measurement':44s} {'dbml':>10s} {'baseline':>10s} {'ratio':>7s} {'goal':>8s}  met?")
    for name, ours, theirs, ratio, goal, met in rows:
        print(f"{name:44s} {ours:>10s} {theirs:>10s} {ratio:>7s} {goal:>8s}  {met}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (under ~2 minutes)")
    parser.add_argument("--workers", type=int, default=dbml.core.inputs.DECODE_WORKERS,
                        help="DataLoader workers (default: dbml's decode pool, %(default)s)")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    started, load_before = time.perf_counter(), os.getloadavg()
    print(f"bench_deep {'--quick' if args.quick else '(full)'}: {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{THREADS} torch thread(s), load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    rng = np.random.default_rng(SEED)
    con = dbml.connect(latency_model="roofline")
    with tempfile.TemporaryDirectory(prefix="bench_deep_") as folder:
        write_pngs(folder, size.images, rng)
        load_images(con, folder, size.train_images)
        load_sequences(con, size.sequences, rng)
        torch.set_num_threads(THREADS)
        print(f"\n1. image rows/s into batches of {BATCH}: {size.images} PNGs, {args.workers} workers")
        images = bench_images(con, folder, size, args.workers)

    enc = dbml.core.inputs.fit(con, "imgs_train", Column("image", "BLOB"), "image", image_size=None, shape=None)
    resnet_options = {"width": size.resnet_width}
    print(f"\n2./3. resnet18 {resnet_options} on {size.train_images} 32x32 images, batch {BATCH}")
    x, y = decoded_images(con, enc)
    resnet = bench_training(con, "resnet18", "imgs_train", "resnet18", Inputs("image", shape=enc.shape),
                            resnet_options, x, y, size.resnet_epochs, size.resnet_rounds)
    print(f"\n3. transformer (defaults) on {size.sequences} token sequences of length {SEQ_LEN}, batch {BATCH}")
    x, y = decoded_sequences(con)
    seq = bench_training(con, "transformer", "seqs", "transformer", Inputs("tokens", vocab=VOCAB + 1, max_len=SEQ_LEN),
                         {}, x, y, size.seq_epochs, size.seq_rounds)

    report(images, resnet, seq)
    load_after = os.getloadavg()
    print(f"\nepochs in medians (first of each run left out): resnet18 {len(resnet['dbml'])} + "
          f"{len(resnet['baseline'])}, transformer {len(seq['dbml'])} + {len(seq['baseline'])}; image rounds "
          f"{size.image_rounds}; load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
          f"{time.perf_counter() - started:.0f} s in all")


def report(images: dict, resnet: dict, seq: dict) -> None:
    """The final table. Epoch ratios: the median over rounds of each round's ratio of medians
    (a round's two methods ran minutes apart, under about the same load)."""
    img_ratio = median(images["dbml"]) / median(images["baseline"])
    wait = median(resnet["wait_share"])
    rows = [("image rows/s into batches (vs DataLoader)", f"{median(images['dbml']):.0f}",
             f"{median(images['baseline']):.0f}", f"{img_ratio:.2f}x", "report", "-"),
            ("resnet18 epoch share waiting on data", f"{100 * wait:.1f} %", "-", "-", "<= 5 %",
             "yes" if wait <= 0.05 else "NO")]
    for name, r in (("resnet18", resnet), ("transformer", seq)):
        ratio = median(r["round_ratio"])
        rows.append((f"{name} eager epoch s (vs hand loop)", f"{median(r['dbml']):.2f}", f"{median(r['baseline']):.2f}",
                     f"{ratio:.3f}x", "<= 1.1x", "yes" if ratio <= 1.1 else "NO"))
        cpu = median(r["dbml_cpu"]) / median(r["baseline_cpu"])
        rows.append((f"{name} CPU s/epoch, whole runs (vs hand)", f"{median(r['dbml_cpu']):.2f}",
                     f"{median(r['baseline_cpu']):.2f}", f"{cpu:.3f}x", "report", "-"))
    table(rows)

if __name__ == "__main__":
    sys.exit(main())
