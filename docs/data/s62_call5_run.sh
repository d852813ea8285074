#!/usr/bin/env bash
# Session 62, call 5 (H200; needs_h200), s62-merge, with about 250 s of device time left: the 8x7B 2-layer step
# with the LM head's bf16 gradient beside HF, then ours alone with the default (one-barrier epilogue) and with
# main's former epilogue (two barriers), one round each. CALL_END 100.
set -u
BIN=m/wip
CALL_END=${CALL_END:-100}
source scripts/device_call_lib.sh
call_begin s62c5
trainer 20 hf_head 8x7B-2layer --hf --set lm_head_grad_dtype=bfloat16
trainer 85 def_1 8x7B-2layer
trainer 90 bars2_1 8x7B-2layer MXTRAIN_GG_WGRAD_EPI_BARS=2
call_end
trainer_summary
