#!/usr/bin/env python3
"""The coefficients of src/cpu/kernels/tanh_poly.h: tanh(x) ~ x p(z) / q(z), z = x^2 on [0, X],
p monic of degree M and q of degree N in z, p(0) = q(0), minimizing the largest relative error
(Lawson's iteratively reweighted least squares on the linearized problem p - g q = 0,
g = tanh(x) / x, in double). Prints the #defines, rounded to float; tests/checkasm checks the
kernels' float evaluation of them (softcap_cols' tanh sweep).
Usage: scripts/fit-tanh.py [X] [M] [N]   (defaults 8.875 4 4; needs numpy)"""
import struct
import sys

import numpy as np


def fit(x_max, m, n, iters=400):
    x = np.unique(np.concatenate([np.linspace(0, x_max, 40000), x_max * np.sin(np.linspace(0, np.pi / 2, 40000))]))
    u = (x / x_max) ** 2  # z / z_max: a well-conditioned basis
    g = np.where(x > 0, np.tanh(x) / np.where(x > 0, x, 1), 1.0)
    vp = np.vander(u, m + 1, increasing=True)[:, 1:]
    vq = np.vander(u, n + 1, increasing=True)[:, 1:]
    a, b = np.concatenate([vp, -g[:, None] * vq], axis=1), g - 1.0  # p(0) = q(0) = 1
    w, q_prev, best = np.full_like(u, 1.0 / len(u)), np.ones_like(u), None
    for _ in range(iters):
        s = np.sqrt(w) / (g * q_prev)
        sol = np.linalg.lstsq(a * s[:, None], b * s, rcond=None)[0]
        pc, qc = np.concatenate([[1.0], sol[:m]]), np.concatenate([[1.0], sol[m:]])
        p, q = np.polynomial.polynomial.polyval(u, pc), np.polynomial.polynomial.polyval(u, qc)
        err = p / q / g - 1
        if best is None or np.max(np.abs(err)) < best[0]:
            best = (np.max(np.abs(err)), pc, qc)
        q_prev, w = q, w * np.abs(err) + 1e-30
        w /= w.sum()
    e, pc, qc = best
    z_max = x_max * x_max
    pz, qz = pc / z_max ** np.arange(m + 1), qc / z_max ** np.arange(n + 1)
    return e, pz / pz[-1], qz / pz[-1]  # p monic


def f32(v):
    """v rounded to binary32, as a C float literal."""
    text = "%.9g" % struct.unpack("f", struct.pack("f", v))[0]
    return text + ("f" if "." in text or "e" in text else ".0f")


if __name__ == "__main__":
    x_max = float(sys.argv[1]) if len(sys.argv) > 1 else 8.875
    m, n = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (4, 4)
    e, p, q = fit(x_max, m, n)
    print("/* relative error of the fit in double: %.3g */" % e)
    print("#define FA_TANH_Z_MAX %s /* %g^2 */" % (f32(x_max * x_max), x_max))
    for j in range(m):
        print("#define FA_TANH_P%d %s" % (j, f32(p[j])))
    for j in range(n + 1):
        print("#define FA_TANH_Q%d %s" % (j, f32(q[j])))
