"""The kernel census reads an optimised GPU HLO module: classes, bytes, FLOPs, loop counts."""

import pytest

from ln_jax.xla import kernel_census

# A hand-written module in the text form of XLA:GPU's optimised HLO (`compiled.as_text()`):
# a slicing fusion, a transpose, a generic (Triton) fusion holding a reduction, a Triton GEMM,
# and a cuBLAS GEMM inside a loop XLA knows runs 3 times. The text is XLA's: lines as long.
HLO = """HloModule jit_f, entry_computation_layout={(f32[1000]{0})->f32[10]{0}}

%fused_slice (param_0: f32[1000]) -> f32[10] {
  %param_0 = f32[1000]{0} parameter(0)
  %view = f32[10,100]{1,0} bitcast(%param_0)
  %slice.1 = f32[1,10]{1,0} slice(%view), slice={[0:1], [0:10]}
  ROOT %flat = f32[10]{0} bitcast(%slice.1)
}

%fused_transpose (param_0.1: bf16[4,8]) -> bf16[8,4] {
  %param_0.1 = bf16[4,8]{1,0} parameter(0)
  ROOT %transpose.1 = bf16[8,4]{1,0} transpose(%param_0.1), dimensions={1,0}
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%fused_norm (param_0.2: bf16[4,8]) -> (f32[4], bf16[4,8]) {
  %param_0.2 = bf16[4,8]{1,0} parameter(0)
  %c = f32[4,8]{1,0} convert(%param_0.2)
  %zero = f32[] constant(0)
  %r = f32[4]{0} reduce(%c, %zero), dimensions={1}, to_apply=%add
  ROOT %t = (f32[4]{0}, bf16[4,8]{1,0}) tuple(%r, %param_0.2)
}

%fused_double (param_0.3: bf16[4,8]) -> bf16[4,8] {
  %param_0.3 = bf16[4,8]{1,0} parameter(0)
  ROOT %twice = bf16[4,8]{1,0} add(%param_0.3, %param_0.3)
}

%gemm_fusion_dot.3_computation (p0: bf16[4,16], p1: bf16[16,8]) -> bf16[4,8] {
  %p0 = bf16[4,16]{1,0} parameter(0)
  %p1 = bf16[16,8]{1,0} parameter(1)
  ROOT %dot.3 = bf16[4,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (loop: (s32[], bf16[4,16], bf16[16,8])) -> (s32[], bf16[4,16], bf16[16,8]) {
  %loop = (s32[], bf16[4,16]{1,0}, bf16[16,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%loop), index=0
  %x = bf16[4,16]{1,0} get-tuple-element(%loop), index=1
  %w = bf16[16,8]{1,0} get-tuple-element(%loop), index=2
  %custom-call.7 = (bf16[4,8]{1,0}, s8[1024]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %next = (s32[], bf16[4,16]{1,0}, bf16[16,8]{1,0}) tuple(%i, %x, %w)
}

%cond (loop.1: (s32[], bf16[4,16], bf16[16,8])) -> pred[] {
  %loop.1 = (s32[], bf16[4,16]{1,0}, bf16[16,8]{1,0}) parameter(0)
  %k = s32[] constant(3)
  %j = s32[] get-tuple-element(%loop.1), index=0
  ROOT %lt = pred[] compare(%j, %k), direction=LT
}

ENTRY %main.1 (a.1: f32[1000], b.1: bf16[4,8], x.1: bf16[4,16], w.1: bf16[16,8]) -> f32[10] {
  %a.1 = f32[1000]{0} parameter(0)
  %b.1 = bf16[4,8]{1,0} parameter(1)
  %x.1 = bf16[4,16]{1,0} parameter(2)
  %w.1 = bf16[16,8]{1,0} parameter(3)
  %wrapped_slice = f32[10]{0} fusion(%a.1), kind=kLoop, calls=%fused_slice
  %input_transpose_fusion.2 = bf16[8,4]{1,0} fusion(%b.1), kind=kInput, calls=%fused_transpose
  %input_transpose_fusion.4 = bf16[8,4]{1,0} fusion(%b.1), kind=kInput, calls=%fused_transpose, metadata={deduplicated_name="input_transpose_fusion.2"}
  %fusion.9 = (f32[4]{0}, bf16[4,8]{1,0}) fusion(%b.1), kind=kCustom, calls=%fused_norm
  %loop_add_fusion.5 = bf16[4,8]{1,0} fusion(%fusion.9#1), kind=kLoop, calls=%fused_double
  %gemm_fusion_dot.3 = bf16[4,8]{1,0} fusion(%x.1, %w.1), kind=kCustom, calls=%gemm_fusion_dot.3_computation
  %zero.1 = s32[] constant(0)
  %init = (s32[], bf16[4,16]{1,0}, bf16[16,8]{1,0}) tuple(%zero.1, %x.1, %w.1)
  %while.1 = (s32[], bf16[4,16]{1,0}, bf16[16,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[10]{0} bitcast(%wrapped_slice)
}
"""


@pytest.fixture(scope="module")
def census():
    return kernel_census.read(HLO)


def test_each_launching_instruction_is_one_kernel_with_its_class_and_count(census):
    kernels = {k.name: (k.cls, k.count) for k in census.kernels}
    assert kernels == {
        "wrapped_slice": ("copy", 1),
        "input_transpose_fusion.2": ("copy", 1),
        "input_transpose_fusion.4": ("copy", 1),  # the same kernel, launched again
        "fusion.9": ("reduction", 1),  # a generic name: classed by the reduce it holds
        "loop_add_fusion.5": ("elementwise", 1),
        "gemm_fusion_dot.3": ("matmul", 1),
        "custom-call.7": ("matmul", 3),  # in the loop body: the known trip count
        "lt": ("elementwise", 3),  # the loop's condition, once a trip
    }


def test_bytes_count_the_output_and_each_operand_once_and_slices_what_they_read(census):
    bytes_ = {k.name: k.bytes for k in census.kernels}
    # reads 10 of the 1000 floats (through a bitcast), not 4000 bytes
    assert bytes_["wrapped_slice"] == 40 + 40
    assert bytes_["input_transpose_fusion.2"] == bytes_["input_transpose_fusion.4"] == 64 + 64
    assert bytes_["fusion.9"] == (16 + 64) + 64  # a tuple output: both arrays
    assert bytes_["gemm_fusion_dot.3"] == 64 + 128 + 256
    # reads element 1 of fusion.9's output ("%fusion.9#1", as newer XLA prints it), not both
    assert bytes_["loop_add_fusion.5"] == 64 + 64
    # cuBLAS's workspace (s8[1024]) is scratch listed among the outputs, not data written
    assert bytes_["custom-call.7"] == 64 + 128 + 256


def test_flops_of_cublas_and_triton_gemms_and_the_floor(census):
    flops = {k.name: k.flops for k in census.kernels if k.flops}
    assert flops == {"gemm_fusion_dot.3": 2 * 4 * 8 * 16, "custom-call.7": 2 * 4 * 8 * 16}
    rows = census.by_class()
    assert rows["matmul"] == {"kernels": 4, "bytes": 448 + 3 * 448, "flops": 4 * 1024}
    assert rows["copy"]["bytes"] == 80 + 2 * 128
    spec = kernel_census.SPECS["h100"]
    floors = census.floor_ms(spec)
    assert floors["matmul"] == pytest.approx(1e3 * 4096 / spec.bf16_flops)
    assert floors["copy"] == pytest.approx(1e3 * 336 / spec.memory_bandwidth)
    summary = census.summary(spec)
    assert summary["total"]["kernels"] == 1 + 2 + 1 + 1 + 4 + 3
    assert [k.name for k in census.kernels_of("copy")] == [
        "input_transpose_fusion.2",
        "input_transpose_fusion.4",
        "wrapped_slice",
    ]
    assert {k.launch_name for k in census.kernels_of("copy")} == {
        "input_transpose_fusion.2",
        "wrapped_slice",
    }
    table = census.format(spec)
    assert "matmul" in table and "input_transpose_fusion.2" in table


@pytest.mark.parametrize(
    "name, cls",
    [
        ("nvjet_tst_128x256_64x4", "matmul"),
        ("input_add_transpose_fusion.12", "copy"),
        ("input_reduce_fusion.3", "reduction"),
        ("loop_multiply_fusion.7", "elementwise"),
        ("ln_jax_flash_fwd", "attention"),
        ("all-reduce-start", "collective"),
    ],
)
def test_kernel_names_class_as_in_a_gpu_profile(name, cls):
    assert kernel_census.kernel_class(name) == cls


def test_text_that_is_not_an_hlo_module_is_a_clear_error():
    with pytest.raises(ValueError, match="no ENTRY computation"):
        kernel_census.read("module @jit_f { func.func public @main() }")


def test_a_profile_joined_with_its_hlo_gives_each_class_s_rate(tmp_path):
    """bench/gpu/profile_summary.py --hlo_dir: the dumped module the profile's kernel names match
    is read; its classes name the profile's kernels, and bytes (FLOPs) over measured time give
    each class's rate against the chip's."""
    from bench.gpu import profile_summary

    (tmp_path / "module_0001.jit_step_fn.sm_9.0_gpu_after_optimizations.txt").write_text(HLO)
    other = HLO.replace("input_transpose_fusion.2", "other_fusion.5").replace("fusion.9", "f.9")
    (tmp_path / "module_0002.jit_other.sm_9.0_gpu_after_optimizations.txt").write_text(other)
    # Two steps of kernels as a GPU profile names them ('.' -> '_'); the cuBLAS call's own name.
    step = [("wrapped_slice", 0.001), ("input_transpose_fusion_2", 0.001),
            ("input_transpose_fusion_2", 0.001), ("fusion_9", 0.004),
            ("loop_add_fusion_5", 0.002), ("gemm_fusion_dot_3", 0.01),
            ("nvjet_tst_64x8", 0.01)]  # fmt: skip
    events = step * 2
    path, census, share = profile_summary.matching_census(str(tmp_path), {n for n, _ in events})
    assert path.endswith("module_0001.jit_step_fn.sm_9.0_gpu_after_optimizations.txt")
    assert share == 1.0  # all five kernels its six fusions launch are in the profile
    classes = {profile_summary.profile_name(k.name): k.cls for k in census.kernels}
    summary = profile_summary.summarize(events, steps=2, classes=classes)
    # "fusion_9" would be elementwise by its name; the HLO says it holds a reduction.
    assert summary["classes"]["reduction"]["ms_per_step"] == pytest.approx(0.004)
    assert summary["classes"]["matmul"]["ms_per_step"] == pytest.approx(0.02)
    spec = kernel_census.SPECS["h100"]
    rates = profile_summary.achieved(summary, census, spec)
    assert rates["copy"]["rate"] == pytest.approx((80 + 2 * 128) / 0.003e-3)
    # the "#1" read (64 + 64 bytes) and the loop condition's compare, 3 x (1 + 4 + 4)
    assert rates["elementwise"]["rate"] == pytest.approx((64 + 64 + 27) / 0.002e-3)
    assert rates["matmul"]["rate"] == pytest.approx(4 * 1024 / 0.02e-3)
    assert rates["matmul"]["of_peak"] == pytest.approx(rates["matmul"]["rate"] / spec.bf16_flops)
    assert kernel_census.spec_for("NVIDIA H100 80GB HBM3") == "h100"
    assert kernel_census.spec_for("NVIDIA H200") == "h200" and kernel_census.spec_for("cpu") is None


def test_a_module_the_census_cannot_read_is_left_out_and_named(tmp_path, capsys):
    from bench.gpu import profile_summary

    (tmp_path / "module_0001.jit_step_fn.sm_9.0_gpu_after_optimizations.txt").write_text(HLO)
    (tmp_path / "module_0002.jit_step_fn.sm_9.0_gpu_after_optimizations.txt").write_text("}")
    path, _, share = profile_summary.matching_census(str(tmp_path), {"fusion_9"})
    assert path.endswith("module_0001.jit_step_fn.sm_9.0_gpu_after_optimizations.txt")
    assert share > 0
    assert "module_0002.jit_step_fn.sm_9.0_gpu_after_optimizations.txt left out: ValueError" in (
        capsys.readouterr().out
    )


def test_a_profile_summary_counts_its_small_kernels_by_duration():
    """profile_summary's `by_duration`: kernels and ms per step in each duration band, so the
    cost of a step's many tiny kernels is read off the profile (the bands' times add up)."""
    from bench.gpu import profile_summary

    step = [("adam_a", 0.002), ("adam_b", 0.003), ("norm", 0.004), ("ln", 0.010),
            ("ln", 0.015), ("gelu", 0.050), ("gemm", 0.400)]  # fmt: skip
    summary = profile_summary.summarize(step * 3, steps=3)
    rows = {row["from_us"]: row for row in summary["by_duration"]}
    assert summary["kernels_per_step"] == 7
    assert rows[0.0]["kernels_per_step"] == 3 and rows[0.0]["ms_per_step"] == pytest.approx(0.009)
    assert rows[5.0]["kernels_per_step"] == 2 and rows[5.0]["ms_per_step"] == pytest.approx(0.025)
    assert rows[20.0]["kernels_per_step"] == 1 and rows[100.0]["to_us"] is None
    total = sum(row["ms_per_step"] for row in summary["by_duration"])
    assert total == pytest.approx(summary["kernel_ms_per_step"])


# A scanned layer's body: one fusion writes this trip's slice into the stacked activations
# (and a second, whole output); a bare dynamic-update-slice does the same for another stack.
IN_PLACE = """HloModule jit_g, entry_computation_layout={(f32[12,64,32]{2,1,0})->f32[12,64,32]{2,1,0}}

%fused_store (param_0: f32[12,64,32], param_1: f32[64,32], param_2: s32[]) -> (f32[12,64,32], f32[64,32]) {
  %param_0 = f32[12,64,32]{2,1,0} parameter(0)
  %param_1 = f32[64,32]{1,0} parameter(1)
  %twice = f32[64,32]{1,0} add(%param_1, %param_1)
  %update = f32[1,64,32]{2,1,0} bitcast(%twice)
  %param_2 = s32[] parameter(2)
  %zero = s32[] constant(0)
  %stored = f32[12,64,32]{2,1,0} dynamic-update-slice(%param_0, %update, %param_2, %zero, %zero)
  ROOT %t = (f32[12,64,32]{2,1,0}, f32[64,32]{1,0}) tuple(%stored, %twice)
}

ENTRY %main.2 (stack.1: f32[12,64,32], x.2: f32[64,32], i.2: s32[], other.2: f32[12,64,32]) -> f32[12,64,32] {
  %stack.1 = f32[12,64,32]{2,1,0} parameter(0)
  %x.2 = f32[64,32]{1,0} parameter(1)
  %i.2 = s32[] parameter(2)
  %other.2 = f32[12,64,32]{2,1,0} parameter(3)
  %loop_dynamic_update_slice_fusion = (f32[12,64,32]{2,1,0}, f32[64,32]{1,0}) fusion(%stack.1, %x.2, %i.2), kind=kLoop, calls=%fused_store
  %update.2 = f32[1,64,32]{2,1,0} bitcast(%x.2)
  %zero.2 = s32[] constant(0)
  %dynamic-update-slice.3 = f32[12,64,32]{2,1,0} dynamic-update-slice(%other.2, %update.2, %i.2, %zero.2, %zero.2)
  ROOT %out.2 = f32[12,64,32]{2,1,0} get-tuple-element(%loop_dynamic_update_slice_fusion), index=0
}
"""


def test_an_in_place_update_moves_its_slice_not_the_whole_stack():
    bytes_ = {k.name: k.bytes for k in kernel_census.read(IN_PLACE).kernels}
    layer = 64 * 32 * 4  # one trip's slice, of a stack 12 times larger
    # reads x and the index, writes the slice and the whole second output
    assert bytes_["loop_dynamic_update_slice_fusion"] == (layer + 4) + (layer + layer)
    assert bytes_["dynamic-update-slice.3"] == (layer + 4 + 4 + 4) + layer


# A Triton GEMM that scales its left operand first, and one that only reads its operands.
PROLOGUE = """HloModule jit_h, entry_computation_layout={(bf16[64,32]{1,0}, bf16[32,16]{1,0})->bf16[64,16]{1,0}}

%gemm_fusion_dot.1_computation (p0: bf16[64,32], p1: bf16[32,16]) -> bf16[64,16] {
  %p0 = bf16[64,32]{1,0} parameter(0)
  %c = bf16[] constant(1.109)
  %b = bf16[64,32]{1,0} broadcast(%c), dimensions={}
  %scaled = bf16[64,32]{1,0} multiply(%p0, %b)
  %p1 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,16]{1,0} dot(%scaled, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%gemm_fusion_dot.2_computation (p0.2: bf16[64,32], p1.2: bf16[32,16]) -> bf16[64,16] {
  %p0.2 = bf16[64,32]{1,0} parameter(0)
  %p1.2 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.2 = bf16[64,16]{1,0} dot(%p0.2, %p1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.3 (x.3: bf16[64,32], w.3: bf16[32,16]) -> bf16[64,16] {
  %x.3 = bf16[64,32]{1,0} parameter(0)
  %w.3 = bf16[32,16]{1,0} parameter(1)
  %gemm_fusion_dot.1 = bf16[64,16]{1,0} fusion(%x.3, %w.3), kind=kCustom, calls=%gemm_fusion_dot.1_computation
  ROOT %gemm_fusion_dot.2 = bf16[64,16]{1,0} fusion(%x.3, %w.3), kind=kCustom, calls=%gemm_fusion_dot.2_computation
}
"""


def test_a_triton_gemm_that_computes_on_its_operand_is_listed():
    assert kernel_census.gemm_prologues(PROLOGUE) == [
        {"name": "gemm_fusion_dot.1", "shape": "bf16[64,16]", "ops": ["multiply"]}
    ]
    assert kernel_census.gemm_prologues(HLO) == []


# XLA names a fusion by its root. An AdamW update of stacked layers concatenates the layers'
# gradients inside its kernel ("loop_concatenate_fusion"), and the bf16 cast of a stacked
# parameter slices it per layer ("loop_slice_fusion"): both compute; a plain concatenation
# only moves data.
NAMED_BY_ROOT = """HloModule jit_s, entry_computation_layout={(f32[2,4]{1,0}, f32[2,4]{1,0})->f32[4,4]{1,0}}

%fused_concatenate (p.0: f32[2,4], p.1: f32[2,4]) -> f32[4,4] {
  %p.0 = f32[2,4]{1,0} parameter(0)
  %p.1 = f32[2,4]{1,0} parameter(1)
  ROOT %cat = f32[4,4]{1,0} concatenate(%p.0, %p.1), dimensions={0}
}

%fused_concatenate.1 (p.2: f32[2,4], p.3: f32[2,4], p.4: f32[4,4]) -> f32[4,4] {
  %p.2 = f32[2,4]{1,0} parameter(0)
  %p.3 = f32[2,4]{1,0} parameter(1)
  %p.4 = f32[4,4]{1,0} parameter(2)
  %grads = f32[4,4]{1,0} concatenate(%p.2, %p.3), dimensions={0}
  %lr = f32[] constant(0.1)
  %lrs = f32[4,4]{1,0} broadcast(%lr), dimensions={}
  %step = f32[4,4]{1,0} multiply(%grads, %lrs)
  ROOT %new = f32[4,4]{1,0} subtract(%p.4, %step)
}

%fused_slice (p.5: f32[4,4]) -> (bf16[2,4], bf16[2,4]) {
  %p.5 = f32[4,4]{1,0} parameter(0)
  %half = bf16[4,4]{1,0} convert(%p.5)
  %s.0 = bf16[2,4]{1,0} slice(%half), slice={[0:2], [0:4]}
  %s.1 = bf16[2,4]{1,0} slice(%half), slice={[2:4], [0:4]}
  ROOT %both = (bf16[2,4]{1,0}, bf16[2,4]{1,0}) tuple(%s.0, %s.1)
}

ENTRY %main.2 (a.2: f32[2,4], b.2: f32[2,4]) -> f32[4,4] {
  %a.2 = f32[2,4]{1,0} parameter(0)
  %b.2 = f32[2,4]{1,0} parameter(1)
  %input_concatenate_fusion = f32[4,4]{1,0} fusion(%a.2, %b.2), kind=kLoop, calls=%fused_concatenate
  %loop_concatenate_fusion = f32[4,4]{1,0} fusion(%a.2, %b.2, %input_concatenate_fusion), kind=kLoop, calls=%fused_concatenate.1
  %loop_slice_fusion = (bf16[2,4]{1,0}, bf16[2,4]{1,0}) fusion(%loop_concatenate_fusion), kind=kLoop, calls=%fused_slice
  ROOT %r = f32[4,4]{1,0} copy(%loop_concatenate_fusion)
}
"""


def test_a_fusion_named_for_a_copy_that_computes_is_elementwise():
    kernels = {k.name: k.cls for k in kernel_census.read(NAMED_BY_ROOT).kernels}
    assert kernels == {
        "input_concatenate_fusion": "copy",
        "loop_concatenate_fusion": "elementwise",  # an update reading concatenated gradients
        "loop_slice_fusion": "elementwise",  # a cast, sliced per layer
        "r": "copy",
    }


# The H200's cuBLAS-only step of 2026-12-04 (arm `cublas`, `../shared/gpu/2026-12-04-h200/`
# hlo.tgz, module_430916): a cuBLAS GEMM whose left operand is element 1 of a multi-output
# fusion ("%input_multiply_reduce_fusion#1", bf16[256,768]), whose element 0 (bf16[768]) has
# one dimension. The census read the tuple's first array as the operand and failed
# (IndexError: the GEMM contracts dimension 1), so bench/gpu/profile_summary.py crashed on that
# step. The lines are XLA's; the entry's producers of the fusion's operands are parameters.
GEMM_OF_A_TUPLE_ELEMENT = """HloModule jit_step_fn, is_scheduled=true

%region_44.76 (reduce_sum.52: bf16[], reduce_sum.53: bf16[]) -> bf16[] {
  %reduce_sum.52 = bf16[] parameter(0), metadata={op_name="reduce_sum" scheduling_name="reduce_sum.52"}
  %reduce_sum.53 = bf16[] parameter(1), metadata={op_name="reduce_sum" scheduling_name="reduce_sum.53"}
  ROOT %reduce_sum.54.0 = bf16[] add(%reduce_sum.52, %reduce_sum.53), metadata={op_name="jit(step_fn)/transpose(jvp())/reduce_sum" scheduling_name="reduce_sum.54.0" stack_frame_id=120}
}

%fused_multiply_reduce (param_0.30683: bf16[256,768], param_1.42122: bf16[256,768]) -> (bf16[768], bf16[256,768]) {
  %param_0.30683 = bf16[256,768]{1,0} parameter(0), metadata={scheduling_name="param_0.30683"}
  %param_1.42122 = bf16[256,768]{1,0} parameter(1), metadata={scheduling_name="param_1.42122"}
  %constant_467_1_clone_1 = bf16[] constant(1)
  %broadcast.202.10.clone.1 = bf16[256,768]{1,0} broadcast(%constant_467_1_clone_1), dimensions={}, metadata={scheduling_name="broadcast.202.10.clone.1"}
  %add.2374.5.clone.1 = bf16[256,768]{1,0} add(%param_1.42122, %broadcast.202.10.clone.1), metadata={op_name="jit(step_fn)/jvp()/add" scheduling_name="add.2374.5.clone.1" stack_frame_id=461}
  %sub.542.5.clone.1 = bf16[256,768]{1,0} subtract(%broadcast.202.10.clone.1, %param_1.42122), metadata={op_name="jit(step_fn)/jvp()/sub" scheduling_name="sub.542.5.clone.1" stack_frame_id=461}
  %mul.2969.3.clone.1 = bf16[256,768]{1,0} multiply(%add.2374.5.clone.1, %sub.542.5.clone.1), metadata={op_name="jit(step_fn)/jvp()/mul" scheduling_name="mul.2969.3.clone.1" stack_frame_id=461}
  %mul.2975.1.clone.1 = bf16[256,768]{1,0} multiply(%param_0.30683, %mul.2969.3.clone.1), metadata={op_name="jit(step_fn)/transpose(jvp())/mul" scheduling_name="mul.2975.1.clone.1" stack_frame_id=444}
  %constant_485_10 = bf16[] constant(0)
  %reduce_sum.1698.1 = bf16[768]{0} reduce(%mul.2975.1.clone.1, %constant_485_10), dimensions={0}, to_apply=%region_44.76, metadata={op_name="jit(step_fn)/transpose(jvp())/reduce_sum" scheduling_name="reduce_sum.1698.1" stack_frame_id=122}
  ROOT %tuple.795 = (bf16[768]{0}, bf16[256,768]{1,0}) tuple(%reduce_sum.1698.1, %mul.2975.1.clone.1), metadata={scheduling_name="tuple.795"}
}

ENTRY %main.370 (custom-call.268: (bf16[256,768], s8[33554432]), loop_convert_fusion.37: bf16[256,768], wrapped_convert.84: bf16[768,768]) -> bf16[256,768] {
  %custom-call.268 = (bf16[256,768]{1,0}, s8[33554432]{0}) parameter(0)
  %loop_convert_fusion.37 = bf16[256,768]{1,0} parameter(1)
  %wrapped_convert.84 = bf16[768,768]{1,0} parameter(2)
  %input_multiply_reduce_fusion = (bf16[768]{0}, bf16[256,768]{1,0}) fusion(%custom-call.268#0, %loop_convert_fusion.37), kind=kInput, calls=%fused_multiply_reduce, metadata={op_name="jit(step_fn)/transpose(jvp())/reduce_sum" scheduling_name="input_multiply_reduce_fusion" stack_frame_id=122}, backend_config={"device_type":"DEVICE_TYPE_INVALID","force_earliest_schedule":false,"native_emitter_backend_config":{"type":"NATIVE_EMITTER_TYPE_INVALID","unroll_factor":0},"operation_queue_id":"0","reification_cost":[]}
  %custom-call.269 = (bf16[256,768]{1,0}, s8[33554432]{0}) custom-call(%input_multiply_reduce_fusion#1, %wrapped_convert.84), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step_fn)/transpose(jvp())/dot_general" scheduling_name="custom-call.269" stack_frame_id=442}, backend_config={"device_type":"DEVICE_TYPE_INVALID","force_earliest_schedule":false,"gemm_backend_config":{"alpha_imag":0,"alpha_real":1,"autotune_workspace_size":"33554432","beta":0,"damax_output":false,"dot_dimension_numbers":{"lhs_batch_dimensions":[],"lhs_contracting_dimensions":["1"],"rhs_batch_dimensions":[],"rhs_contracting_dimensions":["1"]},"epilogue":"DEFAULT","grad_x":false,"grad_y":false,"lhs_stride":"196608","precision_config":{"algorithm":"ALG_UNSET","operand_precision":["DEFAULT","DEFAULT"]},"rhs_stride":"589824","scale_mode":0,"selected_algorithm":"1"},"operation_queue_id":"0","reification_cost":[]}
  ROOT %get-tuple-element.1 = bf16[256,768]{1,0} get-tuple-element(%custom-call.269), index=0
}
"""


def test_a_gemm_reading_an_element_of_a_multi_output_fusion_contracts_that_element():
    kernels = {k.name: k for k in kernel_census.read(GEMM_OF_A_TUPLE_ELEMENT).kernels}
    gemm = kernels["custom-call.269"]
    assert gemm.cls == "matmul"
    assert gemm.flops == 2 * 256 * 768 * 768  # [256, 768] x [768, 768]^T: 768 contracted
    # it reads the element (256 x 768 bf16) and the weight, and writes 256 x 768 (not the
    # cuBLAS workspace)
    assert gemm.bytes == 2 * (256 * 768 + 768 * 768 + 256 * 768)
    assert kernels["input_multiply_reduce_fusion"].flops == 0
