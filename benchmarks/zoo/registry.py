"""The zoo's registry: every model by name, with its library and what its real size is.

``ZOO`` is ordered: transformers' language models, its vision and audio models, then torchvision
and timm (which import only on some machines). ``TRAIN_SET`` names the models whose tiny training
step the CPU tests run on every run (``tests/test_zoo.py``); ``TRAIN_REAL`` those whose training step
the runner (``python -m benchmarks.zoo``) runs by default, after every model's inference.
"""

from __future__ import annotations

from benchmarks.zoo import audio, text, timm_models, tv, vision
from benchmarks.zoo.spec import ZooModel

_MODELS = [
    ZooModel("gpt2", "transformers", "GPT-2 (GPT2LMHeadModel); real: GPT-2 small, 124M, b8 s512", text.gpt2),
    ZooModel("bert", "transformers", "BERT (BertForMaskedLM), padded batch; real: BERT-base, 110M, b16 s512",
             text.bert),
    ZooModel("distilbert", "transformers", "DistilBERT (DistilBertForMaskedLM); real: DistilBERT-base, 66M, b16 s512",
             text.distilbert),
    ZooModel("llama", "transformers",
             "Llama (LlamaForCausalLM): RMSNorm, rotary, SwiGLU, grouped-query attention; real: Llama 3.2 1B shapes, "
             "b4 s512", text.llama),
    ZooModel("qwen2", "transformers",
             "Qwen2 (Qwen2ForCausalLM): GQA with 2 KV heads, q/k/v biases; real: Qwen2 0.5B shapes, b4 s512",
             text.qwen2),
    ZooModel("gpt_neox", "transformers",
             "GPT-NeoX (GPTNeoXForCausalLM): parallel residual, partial rotary; real: Pythia 160M shapes, b8 s512",
             text.gpt_neox),
    ZooModel("t5", "transformers",
             "T5 (T5ForConditionalGeneration): encoder-decoder, relative position buckets, RMS-style norm; "
             "real: T5-base, 220M, b8 s512->128", text.t5),
    ZooModel("whisper_encoder", "transformers",
             "Whisper encoder (WhisperForAudioClassification): conv1d stem, pre-norm encoder; "
             "real: Whisper-base encoder, b8 80x3000", audio.whisper_encoder),
    ZooModel("vit", "transformers", "ViT (ViTForImageClassification); real: ViT-B/16, b64 224", vision.vit),
    ZooModel("clip_vision", "transformers", "CLIP image tower (CLIPForImageClassification); real: ViT-B/32, b64 224",
             vision.clip_vision),
    ZooModel("swin", "transformers", "Swin (SwinForImageClassification); real: Swin-T, b64 224", vision.swin),
    ZooModel("convnext", "transformers", "ConvNeXt (ConvNextForImageClassification); real: ConvNeXt-T, b64 224",
             vision.convnext),
    ZooModel("resnet", "transformers", "ResNet (ResNetForImageClassification); real: ResNet-50, b64 224",
             vision.resnet),
    ZooModel("mobilenet_v2", "transformers",
             "MobileNetV2 (MobileNetV2ForImageClassification); real: width 1.0, b64 224", vision.mobilenet_v2),
    ZooModel("efficientnet", "transformers",
             "EfficientNet (EfficientNetForImageClassification); real: B0, b64 224", vision.efficientnet),
    ZooModel("tv_resnet50", "torchvision", "torchvision ResNet-50, b64 224", tv.resnet50),
    ZooModel("tv_vit_b_16", "torchvision", "torchvision ViT-B/16, b64 224", tv.vit_b_16),
    ZooModel("tv_mobilenet_v3_large", "torchvision", "torchvision MobileNetV3-Large, b64 224", tv.mobilenet_v3_large),
    ZooModel("tv_swin_t", "torchvision", "torchvision Swin-T, b64 224", tv.swin_t),
    ZooModel("tv_convnext_tiny", "torchvision", "torchvision ConvNeXt-T, b64 224", tv.convnext_tiny),
    ZooModel("timm_vit_base_patch16_224", "timm", "timm ViT-B/16, b64 224", timm_models.vit_base_patch16_224),
    ZooModel("timm_efficientnet_b0", "timm", "timm EfficientNet-B0, b64 224", timm_models.efficientnet_b0),
    ZooModel("timm_convnext_tiny", "timm", "timm ConvNeXt-T, b64 224", timm_models.convnext_tiny),
]

ZOO: dict[str, ZooModel] = {m.name: m for m in _MODELS}

TRAIN_SET = ("gpt2", "llama", "bert", "t5", "vit", "resnet", "mobilenet_v2")
TRAIN_REAL = ("gpt2", "llama", "resnet")
