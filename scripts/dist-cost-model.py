#!/usr/bin/env python3
"""The cost model of docs/design/distributed.md: data-parallel ResNet-50 (ImageNet) throughput and
scaling efficiency at N servers for the fp32 and dfp16 allreduce.

  compute per step      T_c = B * t_img                 (t_img: measured per-image training time of
                                                         one server, forward + backward + optimizer)
  backward share        T_b = 2/3 T_c                    (dfp's per-layer profile: backward ~2x forward)
  ring allreduce of S bytes in k buckets over N servers:
                        T_ar = 2 (N-1)/N * S / BW + k * 2 (N-1) * alpha   (+ dfp16: k max allreduces,
                                                                            k * 2 log2(N) * alpha)
  overlap               buckets start as backward completes them; the last bucket (the first layers,
                        a 1/k share) starts after backward, so the exposed time is
                        T_x = T_ar / k + max(0, T_ar * (k-1)/k - T_b)
  throughput            N * B / (T_c + T_x);  efficiency T_c / (T_c + T_x)

Usage: scripts/dist-cost-model.py [t_img_seconds_per_server] (default: this file's estimate)
"""
import math
import sys

PARAMS = 25_557_032          # ResNet-50 trainable parameters
B = 256                      # images per server and step
BUCKET = 25 * 2**20          # FP32 bytes per bucket (PyTorch DDP's default)
t_img = float(sys.argv[1]) if len(sys.argv) > 1 else 0.077 / 28
nets = {"10 GbE (1.25 GB/s, 30 us)": (1.25e9, 30e-6), "25 GbE (3.1 GB/s, 20 us)": (3.125e9, 20e-6), "100 Gb/s IB (12.5 GB/s, 2 us)": (12.5e9, 2e-6)}

Tc = B * t_img
Tb = 2 / 3 * Tc
print(f"compute per step {Tc*1e3:.0f} ms (B = {B}, t_img = {t_img*1e3:.2f} ms per image per server)")
for net, (bw, alpha) in nets.items():
    print(f"\n{net}")
    print("    N   fp32 img/s  eff.   dfp16 img/s  eff.")
    for n in (2, 4, 8, 16, 32, 64):
        row = []
        for fmt, bytes_per in (("fp32", 4), ("dfp16", 2)):
            k = math.ceil(PARAMS * 4 / BUCKET)
            S = PARAMS * bytes_per
            Tar = 2 * (n - 1) / n * S / bw + k * 2 * (n - 1) * alpha
            if fmt == "dfp16":
                Tar += k * 2 * math.log2(n) * alpha
            Tx = Tar / k + max(0.0, Tar * (k - 1) / k - Tb)
            row += [n * B / (Tc + Tx), Tc / (Tc + Tx)]
        print(f"  {n:3d}  {row[0]:10.0f}  {row[1]:.2f}  {row[2]:11.0f}  {row[3]:.2f}")
