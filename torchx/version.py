from torchx import IMAGE, __version__

TORCHX_IMAGE = IMAGE

__all__ = ["__version__", "TORCHX_IMAGE"]
