"""The zoo's registry: every model by name, with its library and what its real size is.

``ZOO`` is ordered: transformers' language models (the first seven, then more encoders, decoders
and encoder-decoders), its audio and vision models, diffusers' models, then torchvision and timm
(which import only on some machines). ``TRAIN_SET`` names the models whose tiny training step the
CPU tests run with ``--zoo-train=core`` (``tests/test_zoo.py``); ``TRAIN_REAL`` those whose
training step the runner (``python -m benchmarks.zoo``) runs by default, after every model's
inference: some of each family, none over 2.6B parameters (by estimate, the real step's weights,
gradients and activations in bf16 take at most about 30 GB).
"""

from __future__ import annotations

from benchmarks.zoo import (
    audio, by_name, decoders, diffusion, encoders, image_convnets, image_transformers, seq2seq, text, timm_models, tv,
    vision,
)
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
    ZooModel("roberta", "transformers",
             "RoBERTa (RobertaForMaskedLM): positions after the padding id, no token types; real: RoBERTa-base, "
             "125M, b16 s512", encoders.roberta),
    ZooModel("xlm_roberta", "transformers",
             "XLM-RoBERTa (XLMRobertaForMaskedLM): RoBERTa with a 250k vocabulary; real: XLM-R base, 278M, b16 s512",
             encoders.xlm_roberta),
    ZooModel("albert", "transformers",
             "ALBERT (AlbertForMaskedLM): one layer's weights shared by all, factorized embedding; "
             "real: ALBERT-base v2, 12M, b16 s512", encoders.albert),
    ZooModel("electra", "transformers",
             "ELECTRA discriminator (ElectraForPreTraining): per-token replaced-token detection, binary "
             "cross-entropy; real: ELECTRA-base, 110M, b16 s512", encoders.electra),
    ZooModel("convbert", "transformers",
             "ConvBERT (ConvBertForMaskedLM): half the heads span-based dynamic convolutions over unfolded windows; "
             "real: ConvBERT-base, 106M, b16 s512", encoders.convbert),
    ZooModel("deberta_v2", "transformers",
             "DeBERTa-v2 (DebertaV2ForMaskedLM): disentangled attention over log-bucketed relative positions; "
             "real: DeBERTa-v3-base, 184M, b16 s512", encoders.deberta_v2),
    ZooModel("mistral", "transformers",
             "Mistral (MistralForCausalLM): sliding-window attention, GQA with 8 KV heads; real: Mistral 7B, b4 s512",
             decoders.mistral),
    ZooModel("phi", "transformers",
             "Phi (PhiForCausalLM): parallel attention and MLP, partial rotary, LayerNorm; real: Phi-2, 2.7B, b4 s512",
             decoders.phi),
    ZooModel("phi3", "transformers",
             "Phi-3 (Phi3ForCausalLM): fused qkv and gate-up projections, SwiGLU; real: Phi-3-mini, 3.8B, b4 s512",
             decoders.phi3),
    ZooModel("gemma", "transformers",
             "Gemma (GemmaForCausalLM): GeGLU, one KV head (multi-query), scaled embeddings; real: Gemma 2B, b4 s512",
             decoders.gemma),
    ZooModel("gemma2", "transformers",
             "Gemma 2 (Gemma2ForCausalLM): attention and logit soft-capping, local/global layers, pre- and "
             "post-norms, GeGLU; real: Gemma 2 2B, b4 s512", decoders.gemma2),
    ZooModel("opt", "transformers", "OPT (OPTForCausalLM): learned positions, ReLU MLP; real: OPT-125M, b8 s512",
             decoders.opt),
    ZooModel("bloom", "transformers",
             "BLOOM (BloomForCausalLM): ALiBi position biases, embedding LayerNorm; real: BLOOM-560M, b8 s512",
             decoders.bloom),
    ZooModel("falcon", "transformers",
             "Falcon (FalconForCausalLM): multi-query attention (one KV head), parallel attention and MLP; "
             "real: Falcon-7B, b4 s512", decoders.falcon),
    ZooModel("gptj", "transformers",
             "GPT-J (GPTJForCausalLM): interleaved rotary on 64 dims per head, parallel attention and MLP; "
             "real: GPT-J 6B, b4 s512", decoders.gptj),
    ZooModel("stablelm", "transformers",
             "StableLM 2 (StableLmForCausalLM): partial rotary, LayerNorm, q/k/v biases; real: StableLM 2 1.6B, "
             "b4 s512", decoders.stablelm),
    ZooModel("gpt_bigcode", "transformers",
             "GPTBigCode (GPTBigCodeForCausalLM): multi-query attention, fused q/kv projection; "
             "real: StarCoderBase-1B, b4 s512", decoders.gpt_bigcode),
    ZooModel("mixtral", "transformers",
             "Mixtral (MixtralForCausalLM): 8 experts, the top 2 a token, grouped-query attention; real: Mixtral's "
             "layout at 16 layers of 1024, 1.5B, b4 s512", decoders.mixtral),
    ZooModel("mamba", "transformers",
             "Mamba (MambaForCausalLM): selective state-space model on its pure PyTorch path (a loop over "
             "positions); real: Mamba-130M, b8 s32", decoders.mamba),
    ZooModel("bart", "transformers",
             "BART (BartForConditionalGeneration): learned positions, post-norm, GELU; real: BART-base, 140M, "
             "b8 s512->128", seq2seq.bart),
    ZooModel("pegasus", "transformers",
             "Pegasus (PegasusForConditionalGeneration): sinusoidal positions, pre-norm; real: Pegasus-large, 568M, "
             "b8 s512->128", seq2seq.pegasus),
    ZooModel("marian", "transformers",
             "Marian (MarianMTModel): sinusoidal positions, SiLU, logit bias; real: OPUS-MT en-de, 74M, "
             "b32 s128->128", seq2seq.marian),
    ZooModel("mt5", "transformers",
             "mT5 (MT5ForConditionalGeneration): relative position buckets, gated-GELU, 250k vocabulary; "
             "real: mT5-base shapes (head tied, 390M), b8 s512->128", seq2seq.mt5),
    ZooModel("longt5", "transformers",
             "LongT5 (LongT5ForConditionalGeneration): transient-global attention (local blocks and per-block "
             "summary tokens); real: LongT5-TGlobal-base, 223M, b4 s4096->256", seq2seq.longt5),
    ZooModel("whisper_encoder", "transformers",
             "Whisper encoder (WhisperForAudioClassification): conv1d stem, pre-norm encoder; "
             "real: Whisper-base encoder, b8 80x3000", audio.whisper_encoder),
    ZooModel("whisper", "transformers",
             "Whisper (WhisperForConditionalGeneration): encoder-decoder on log-mel features, token targets; "
             "real: Whisper-base, 74M, b8 80x3000->128", audio.whisper),
    ZooModel("wav2vec2", "transformers",
             "wav2vec 2.0 (Wav2Vec2ForCTC): conv feature encoder on raw audio (GroupNorm), conv positions, "
             "CTC loss; real: wav2vec 2.0 base, 95M, b8 10 s at 16 kHz", audio.wav2vec2),
    ZooModel("hubert", "transformers",
             "HuBERT (HubertForSequenceClassification): wav2vec 2.0's encoder, mean-pooled classifier; "
             "real: HuBERT-base, 95M, b8 10 s at 16 kHz", audio.hubert),
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
    ZooModel("deit", "transformers",
             "DeiT (DeiTForImageClassification): ViT with class and distillation tokens; real: DeiT-S/16, 22M, b64 224",
             image_transformers.deit),
    ZooModel("beit", "transformers",
             "BEiT (BeitForImageClassification): relative position bias, layer scale, mean pooling; "
             "real: BEiT-B/16, 86M, b64 224", image_transformers.beit),
    ZooModel("dinov2", "transformers",
             "DINOv2 (Dinov2ForImageClassification): 14x14 patches, layer scale, bicubic-interpolated positions; "
             "real: ViT-B/14, 88M, b64 224", image_transformers.dinov2),
    ZooModel("swinv2", "transformers",
             "Swin v2 (Swinv2ForImageClassification): cosine attention, MLP position bias, res-post-norm; "
             "real: Swin v2-T, windows of 8, 28M, b64 256", image_transformers.swinv2),
    ZooModel("levit", "transformers",
             "LeViT (LevitForImageClassification): conv stem, attention with batch-normed projections and "
             "attention biases, hard-swish; real: LeViT-128S, 7.4M, b64 224", image_transformers.levit),
    ZooModel("mobilevit", "transformers",
             "MobileViT (MobileViTForImageClassification): inverted residuals and unfold-transformer-fold "
             "blocks; real: MobileViT-S, 5.6M, b64 256", image_transformers.mobilevit),
    ZooModel("segformer", "transformers",
             "Segformer (SegformerForSemanticSegmentation): semantic segmentation, spatially reduced attention, "
             "Mix-FFN, all-MLP decoder; real: MiT-b0, 3.8M, b8 512, 150 classes", image_transformers.segformer),
    ZooModel("poolformer", "transformers",
             "PoolFormer (PoolFormerForImageClassification): average-pool token mixer, one-group GroupNorm; "
             "real: PoolFormer-S12, 12M, b64 224", image_convnets.poolformer),
    ZooModel("convnextv2", "transformers",
             "ConvNeXt V2 (ConvNextV2ForImageClassification): global response normalization; "
             "real: ConvNeXt V2-T, 28.6M, b64 224", image_convnets.convnextv2),
    ZooModel("regnet", "transformers",
             "RegNet (RegNetForImageClassification): grouped-convolution bottlenecks with squeeze-and-excitation; "
             "real: RegNetY-4GF, 20.6M, b64 224", image_convnets.regnet),
    ZooModel("bit", "transformers",
             "BiT (BitForImageClassification): pre-activation ResNet, weight-standardized convolutions, GroupNorm "
             "of 32; real: BiT-M R50x1, 25.5M, b64 224", image_convnets.bit),
    ZooModel("sd_unet", "diffusers",
             "Stable Diffusion UNet (UNet2DConditionModel): ResNet blocks with GroupNorm, cross-attention to text, "
             "timestep embedding, noise-prediction MSE; real: SD 1.5, 860M, b2 latents 4x64x64, text 77x768",
             diffusion.sd_unet),
    ZooModel("sd_vae_decoder", "diffusers",
             "Stable Diffusion VAE decoder (AutoencoderKL.decode): GroupNorm of 32, mid-block attention, "
             "upsampling; real: SD's VAE, b2 latents 4x64x64 -> 3x512x512", diffusion.sd_vae_decoder),
    ZooModel("tv_resnet50", "torchvision", "torchvision ResNet-50, b64 224", tv.resnet50),
    ZooModel("tv_vit_b_16", "torchvision", "torchvision ViT-B/16, b64 224", tv.vit_b_16),
    ZooModel("tv_mobilenet_v3_large", "torchvision", "torchvision MobileNetV3-Large, b64 224", tv.mobilenet_v3_large),
    ZooModel("tv_swin_t", "torchvision", "torchvision Swin-T, b64 224", tv.swin_t),
    ZooModel("tv_convnext_tiny", "torchvision", "torchvision ConvNeXt-T, b64 224", tv.convnext_tiny),
    ZooModel("tv_densenet121", "torchvision", "torchvision DenseNet-121: dense blocks, 8.0M, b64 224",
             tv.densenet121),
    ZooModel("tv_resnext50_32x4d", "torchvision",
             "torchvision ResNeXt-50 32x4d: grouped 3x3 convolutions, 25M, b64 224", tv.resnext50_32x4d),
    ZooModel("tv_regnet_x_1_6gf", "torchvision", "torchvision RegNetX-1.6GF: grouped convolutions, 9.2M, b64 224",
             tv.regnet_x_1_6gf),
    ZooModel("tv_efficientnet_v2_s", "torchvision",
             "torchvision EfficientNetV2-S: fused MBConv, then MBConv with SE, 21.5M, b64 224", tv.efficientnet_v2_s),
    ZooModel("tv_deeplabv3_resnet50", "torchvision",
             "torchvision DeepLabV3-ResNet50: segmentation, dilated backbone, atrous pyramid pooling, 39.6M, "
             "b8 512, 21 classes", tv.deeplabv3_resnet50),
    ZooModel("tv_lraspp_mobilenet_v3_large", "torchvision",
             "torchvision LR-ASPP MobileNetV3-Large: segmentation, a pooled sigmoid gate on the high features, "
             "3.2M, b8 512, 21 classes", tv.lraspp_mobilenet_v3_large),
    ZooModel("tv_shufflenet_v2_x1_0", "torchvision", "torchvision ShuffleNetV2 1.0: channel split and shuffle, 2.3M, "
             "b64 224", tv.shufflenet_v2_x1_0),
    ZooModel("tv_r3d_18", "torchvision", "torchvision R3D-18: 3-d convolutions over video clips, 33M, "
             "b8 3x16x112x112", tv.r3d_18),
    ZooModel("timm_vit_base_patch16_224", "timm", "timm ViT-B/16, b64 224", timm_models.vit_base_patch16_224),
    ZooModel("timm_efficientnet_b0", "timm", "timm EfficientNet-B0, b64 224", timm_models.efficientnet_b0),
    ZooModel("timm_convnext_tiny", "timm", "timm ConvNeXt-T, b64 224", timm_models.convnext_tiny),
    ZooModel("timm_mixer_b16_224", "timm", "timm MLP-Mixer B/16: token- and channel-mixing MLPs, 60M, b64 224",
             timm_models.mixer_b16_224),
    ZooModel("timm_resmlp_12_224", "timm", "timm ResMLP-12: linear patch mixing, affine norms, 15M, b64 224",
             timm_models.resmlp_12_224),
    ZooModel("timm_poolformer_s12", "timm", "timm PoolFormer-S12 (MetaFormer): pooling mixer, GroupNorm1, 12M, b64 224",
             timm_models.poolformer_s12),
    ZooModel("timm_nf_resnet50", "timm",
             "timm NF-ResNet-50: normalization-free, scaled weight-standardized convolutions, 25.6M, b64 224",
             timm_models.nf_resnet50),
    ZooModel("timm_coatnet_0_rw_224", "timm", "timm CoAtNet-0: MBConv stages then relative-attention stages, 27M, "
             "b64 224", timm_models.coatnet_0_rw_224),
    ZooModel("timm_efficientvit_b0", "timm", "timm EfficientViT-B0 (MIT): ReLU linear attention, 3.4M, b64 224",
             timm_models.efficientvit_b0),
    ZooModel("timm_convmixer_768_32", "timm", "timm ConvMixer-768/32: depthwise and pointwise convolutions, 21M, "
             "b64 224", timm_models.convmixer_768_32),
    ZooModel("timm_ghostnet_100", "timm", "timm GhostNet-1.0: ghost modules (half the channels a depthwise "
             "convolution of the other half), SE, 5.2M, b64 224", timm_models.ghostnet_100),
    ZooModel("timm_xcit_tiny_12_p16_224", "timm", "timm XCiT-T12/16: cross-covariance attention, local patch "
             "interaction, 6.7M, b64 224", timm_models.xcit_tiny_12_p16_224),
    ZooModel("timm_volo_d1_224", "timm", "timm VOLO-D1: outlook attention (unfold/fold), class attention, 27M, "
             "b64 224", timm_models.volo_d1_224),
    ZooModel("timm_eva02_tiny_patch14_224", "timm", "timm EVA-02-T/14: rotary position embedding on all tokens "
             "but the class token, SwiGLU MLPs, 5.5M, b64 224", timm_models.eva02_tiny_patch14_224),
    ZooModel("timm_maxvit_tiny_tf_224", "timm", "timm MaxViT-T: MBConv, block and grid attention, 31M, b64 224",
             timm_models.maxvit_tiny_tf_224),
]

ZOO: dict[str, ZooModel] = {m.name: m for m in _MODELS}


def entry(name: str) -> ZooModel:
    """The zoo model ``name``, or a model outside the zoo by its library's name (``timm:NAME``,
    ``tv:NAME``: ``by_name.py``); ``KeyError`` for any other name."""
    if name in ZOO:
        return ZOO[name]
    if by_name.is_by_name(name):
        return by_name.model(name)
    raise KeyError(name)

TRAIN_SET = ("gpt2", "llama", "bert", "t5", "vit", "resnet", "mobilenet_v2")
TRAIN_REAL = ("gpt2", "llama", "resnet", "roberta", "deberta_v2", "opt", "gemma", "bart", "whisper", "wav2vec2",
              "swinv2", "convnextv2", "segformer", "sd_unet", "tv_resnext50_32x4d", "timm_coatnet_0_rw_224")
