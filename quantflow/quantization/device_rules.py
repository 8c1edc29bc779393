"""What CANN's own compile passes decide about a quantized op: whether it runs in INT8 on the device at all.

A convolution whose AscendQuant input has 16 channels or fewer is rolled back to float16 by the GE/FE fusion
engine's quant pass: the AscendQuant and AscendDequant are removed and the convolution runs in float16
(``BiasOptimizeQuantRollbackBase::GetQuantProcessMode``: ``if (input_shape.GetDim(index_ci) >
MIN_BIAS_OPTIMIZE_CHANNEL) ... BIAS_OPTIMIZE ... else ... QUANT_ROLLBACK`` with ``MIN_BIAS_OPTIMIZE_CHANNEL =
16``, air/compiler/graphcompiler/engines/nneng/.../quant_pass/bias_optimize_quant_rollback/
bias_optimize_quant_rollback_base.{h,cc}, GE/FE source snapshot of 2022; the C compared is the whole channel
count of the tensor entering AscendQuant, also for depthwise and grouped convolutions).  AMCT's documentation
gives the same limit as a hardware restriction ("do not perform QAT when the number of input channels (Cin) in
the original model is less than or equal to 16", CANN 8.5 AMCT, atlasamct_16_0177).  Such a layer is left in
float16 in both deploy graphs and in the emulation (the original float weights, as AMCT's advice leaves it),
instead of writing a quantization the device would discard.

MatMulV2 (ONNX Gemm) is never rolled back by CANN (``MatmulV2QuantProcessFusionPass::GetQuantProcessMode``
always chooses BIAS_OPTIMIZE), but the MindSpore deploy network writes a quantized Dense as a 1x1 Conv2D on
its reshaped input (``quantflow.ops.nn``), which the Conv2D rule rolls back.  Leaving a MatMul reading 16
features or fewer in float16 in both deploy graphs (and the emulation) is therefore quantflow's choice, for
consistency -- the ONNX deploy graph's Gemm would stay INT8 under CANN's own rule -- so that both deploy graphs
compute the same thing (CANN's MatMulV2 and BatchMatMulV2 quant passes never roll back).

Whether a newer CANN keeps such layers INT8: ATC's ``--compression_optimize_conf`` option
``enable_first_layer_quantization`` (with ``--enable_small_channel=1``, Atlas inference series) fuses AIPP with
the first layer's Quant (CANN 9.0 ATC documentation, atlasatcparam_16_0059), but no public source says what the
device then computes, so quantflow offers no such mode.
"""
from __future__ import annotations

MIN_BIAS_OPTIMIZE_CHANNEL = 16   # CANN: at most this many input channels -> the quantized op is rolled back


def rollback_reason(op: str, in_channels: int) -> str | None:
    """Why CANN would run the quantized ``op`` (Conv2D / MatMul) reading ``in_channels`` channels (features) in
    float16, or None when it runs in INT8."""
    if in_channels > MIN_BIAS_OPTIMIZE_CHANNEL:
        return None
    if op == "Conv2D":
        return (f"{in_channels} input channels <= {MIN_BIAS_OPTIMIZE_CHANNEL}: CANN's quant pass rolls such "
                f"convolutions back to float16")
    return (f"{in_channels} input features <= {MIN_BIAS_OPTIMIZE_CHANNEL}: written as a 1x1 Conv2D in the "
            f"MindSpore deploy network, which CANN's quant pass rolls back to float16; quantflow leaves it float16 "
            f"in the ONNX deploy graph too, for consistency (CANN would keep that Gemm INT8)")
