#!/usr/bin/python3
"""An independent reference for kernels/transferability.h, in NumPy and float64, written from the
definitions rather than from msaflow's algebra:
- LogME: for each class's one-hot column t, the evidence of Bayesian linear regression
  t ~ N(F m, 1/beta), m ~ N(0, 1/alpha): A = alpha I + beta F^T F through the d x d Gram's
  eigenvectors (msaflow uses the smaller Gram and the left singular vectors), m = beta A^-1 F^T t
  in feature space, gamma = d - alpha tr(A^-1), log|A| over all d eigenvalues; MacKay's updates
  until alpha/beta settles; the mean over classes of evidence / n.
- leave-one-out kNN: features standardised (population std; constant dimensions zero), every
  pairwise distance from the differences, neighbours by (distance, index), the vote's ties to the
  nearer voters' sum, then the lower class.
Usage: transferability_reference.py FEATURES.f32 LABELS.u8 N D CLASSES K -> JSON {logme, knn}"""
import json
import sys

import numpy as np


def logme(f, y, classes):
    n, d = f.shape
    # A = alpha I + beta F^T F is inverted through the d x d Gram's eigenvectors (computed once):
    # A^-1 = V diag(1 / (alpha + beta s)) V^T, log|A| = sum log(alpha + beta s) over all d.
    s, v = np.linalg.eigh(f.T @ f)
    s = np.maximum(s, 0)
    out = []
    for c in range(classes):
        t = (y == c).astype(np.float64)
        vfty = v.T @ (f.T @ t)

        def at(alpha, beta):
            m = v @ (beta * vfty / (alpha + beta * s))
            return m, float(np.sum((f @ m - t) ** 2))
        alpha, beta = 1.0, 1.0
        for _ in range(100):
            m, r = at(alpha, beta)
            gamma = d - alpha * np.sum(1 / (alpha + beta * s))
            new_alpha, new_beta = gamma / (m @ m + 1e-12), (n - gamma) / (r + 1e-12)
            settled = abs(new_alpha / new_beta - alpha / beta) <= 1e-10 * (alpha / beta)
            alpha, beta = new_alpha, new_beta
            if settled:
                break
        m, r = at(alpha, beta)
        ev = (d / 2 * np.log(alpha) + n / 2 * np.log(beta) - 0.5 * np.sum(np.log(alpha + beta * s)) - beta / 2 * r
              - alpha / 2 * float(m @ m) - n / 2 * np.log(2 * np.pi))
        out.append(ev / n)
    return float(np.mean(out))


def knn(f, y, k):
    n = len(f)
    sd = f.std(axis=0)
    z = (f - f.mean(axis=0)) / np.where(sd > 0, sd, 1)
    z[:, sd == 0] = 0
    dist = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    correct = 0
    for i in range(n):
        others = [j for j in range(n) if j != i]
        order = sorted(others, key=lambda j: (dist[i, j], j))[:k]
        votes = {}
        for j in order:
            v = votes.setdefault(int(y[j]), [0, 0.0])
            v[0] += 1
            v[1] += dist[i, j]
        best = sorted(votes.items(), key=lambda kv: (-kv[1][0], kv[1][1], kv[0]))[0][0]
        correct += best == y[i]
    return correct / n


def main():
    path_f, path_y, n, d, classes, k = sys.argv[1:7]
    n, d, classes, k = int(n), int(d), int(classes), int(k)
    f = np.fromfile(path_f, np.float32).reshape(n, d).astype(np.float64)
    y = np.fromfile(path_y, np.uint8)
    print(json.dumps({"logme": logme(f, y, classes), "knn": knn(f, y, k)}))


if __name__ == "__main__":
    main()
