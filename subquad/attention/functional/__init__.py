"""Parameter-free attention math.

Convention: q: (B, h, N, d), k and v: (B, h, n, d); outputs (B, h, N, d) -- the layout of
`torch.nn.functional.scaled_dot_product_attention`. Each file holds a dense `*_ref` (clear, float64-capable) and the
fast path(s) tested against it.
"""
