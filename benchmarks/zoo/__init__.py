"""The model zoo: real architectures (transformers, diffusers, torchvision, timm) built from
configurations with random weights, in a tiny size for CPU tests and a real size for GPU runs.
Nothing is downloaded.

    from benchmarks.zoo import ZOO
    built = ZOO["gpt2"].build("tiny", "cpu", torch.float32)
    out = built.model(**built.inputs)
    loss = built.loss(built.model(**built.train_inputs))

``spec.py`` says what a build returns; ``registry.py`` lists the models; ``text.py``,
``encoders.py``, ``decoders.py``, ``seq2seq.py``, ``audio.py``, ``vision.py``,
``image_transformers.py``, ``image_convnets.py`` (transformers), ``diffusion.py`` (diffusers),
``tv.py`` (torchvision) and ``timm_models.py`` build them; ``compare.py`` measures compiled results
against eager and float64; ``run.py`` is the GPU runner (``python -m benchmarks.zoo --help``).
"""

from benchmarks.zoo.registry import TRAIN_REAL, TRAIN_SET, ZOO
from benchmarks.zoo.spec import SIZES, Built, Size, Unavailable, ZooModel

__all__ = ["ZOO", "TRAIN_SET", "TRAIN_REAL", "SIZES", "Built", "Size", "Unavailable", "ZooModel"]
