#!/usr/bin/env python3
"""Convert scikit-learn's "digits" data set into examples/train/data/digits.csv.

Run once (the CSV is committed; the trainer never needs Python):

    python3 -m venv /tmp/skvenv
    /tmp/skvenv/bin/pip install scikit-learn
    /tmp/skvenv/bin/python examples/train/data/convert_digits.py

Output format (what `flotilla-train --data` reads):
  * lines starting with '#' are comments (the file opens with a few, naming the source);
  * every other non-empty line is one sample: the label (0..9), then the 64 pixel values
    of the 8x8 image in row-major order, each an integer 0..16, separated by commas;
  * samples keep scikit-learn's order (the order of the original UCI test set), which the
    trainer's train/test split relies on.

See LICENSE.md next to this file for the data's origin and licences.
"""

import os
import sys

from sklearn.datasets import load_digits


def main() -> int:
    digits = load_digits()
    data, target = digits.data, digits.target
    assert data.shape == (1797, 64), data.shape
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        f.write("# scikit-learn digits (sklearn.datasets.load_digits), 1797 samples, 8x8, 10 classes\n")
        f.write("# from UCI ML 'Optical Recognition of Handwritten Digits' (CC BY 4.0); see LICENSE.md\n")
        f.write("# format: label,p0..p63 (row-major, integers 0..16)\n")
        for row, label in zip(data, target):
            pixels = [int(v) for v in row]
            assert all(0 <= v <= 16 for v in pixels)
            f.write(",".join([str(int(label))] + [str(v) for v in pixels]) + "\n")
    os.replace(tmp, out)
    print(f"wrote {len(target)} samples to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
