"""Model file formats: GGUF files, HF directories and the block-quant codecs. Knows nothing of the runtime."""

from oxinfer.formats.default_model import default_model_path
from oxinfer.formats.gguf_file import GGUFFile
from oxinfer.formats.hf_dir import HFDirectory
from oxinfer.formats import iquants, kquants  # noqa: F401 - register Q5_0, Q5_1, IQ4_NL, the k-quants, the IQ2/IQ3 grids
from oxinfer.formats.codec import CODECS, codec
from oxinfer.formats.quants import QuantMatrix

__all__ = ["CODECS", "GGUFFile", "HFDirectory", "QuantMatrix", "codec", "default_model_path"]
