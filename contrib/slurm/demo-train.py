#!/usr/bin/python3
"""The demo's "training" job: reads a dataset the way PyTorch and TensorFlow
jobs do, for several epochs, and prints each epoch's time. It knows nothing
of Monarch: it opens its usual paths.

  demo-train.py DATASET [--epochs 3] [--workers 4]

images/ (small files in class folders) goes through a torch DataLoader with
fork workers, records/ (large files) through threads reading 256 KiB chunks."""
import argparse
import os
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class ImageFolderBytes(Dataset):
    """torchvision's DatasetFolder, minus decoding: (bytes, class) pairs."""

    def __init__(self, root):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [(os.path.join(root, c, n), i) for i, c in enumerate(classes)
                        for n in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        with open(path, "rb") as f:
            data = f.read()
        return torch.tensor(len(data)), target


def read_records(root, threads=4, chunk=256 << 10):
    """TFRecord pattern: each thread reads whole files in 256 KiB preads."""
    files = sorted(os.path.join(root, n) for n in os.listdir(root))
    order = torch.randperm(len(files)).tolist()
    total, lock = [0], threading.Lock()
    it = iter(order)

    def run():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            fd, off = os.open(files[i], os.O_RDONLY), 0
            while b := os.pread(fd, chunk, off):
                off += len(b)
            os.close(fd)
            with lock:
                total[0] += off

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    images = ImageFolderBytes(os.path.join(a.dataset, "images"))
    loader = DataLoader(images, batch_size=32, shuffle=True, num_workers=a.workers,
                        multiprocessing_context="fork")
    for epoch in range(1, a.epochs + 1):
        start = time.time()
        nbytes = sum(int(sizes.sum()) for sizes, _ in loader)
        nbytes += read_records(os.path.join(a.dataset, "records"))
        took = time.time() - start
        print(f"epoch {epoch}: {nbytes / 2**20:.0f} MiB in {took:.2f} s "
              f"({nbytes / 2**20 / took:.0f} MiB/s)", flush=True)


if __name__ == "__main__":
    main()
