"""Layers, the residual sub-layer (where LayerNorm placement is decided), the placement table,
initialisers and Admin.
"""
