#!/usr/bin/env python3
"""gradsync.torch on a GPU: CUDA parameters live in the packs' GPU memory
(zero copy, through __cuda_array_interface__), NCCL reduces them, the
engine queues its work on PyTorch's current stream. 1 rank, and 2 ranks
on GPU 0 (each a host of its own for NCCL), against torch.optim.SGD on
the GPU. Skips (77) without a GPU or a CUDA build of PyTorch.

usage: test_gpu_torch.py BIN_DIR PYTHON_DIR
"""
import os
import sys
import tempfile

try:
    import torch
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: no GPU visible to PyTorch (torch.cuda.is_available() is False)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.argv = [sys.argv[0], "equivalence"] + sys.argv[1:]
import test_torch  # noqa: E402
import torch_worker  # noqa: E402


def main():
    torch_worker.DEVICE = "cuda"  # the reference on the GPU too
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, 2):
            want = [p.cpu() for p in test_torch.reference(50, 8, world, 0.1, 0.9, 1e-3, False)]
            out = tempfile.mkdtemp(dir=tmp)
            test_torch.run(world, "equivalence", out, "device=cuda", "lr=0.1", "momentum=0.9",
                           "wd=0.001")
            got = test_torch.result(out, 0)
            err = test_torch.rel(got["params"], want)
            assert err < 1e-5, (world, err)
            assert got["copies"] == 0 and all(a == c and b == d for a, b, c, d in got["views"])
            print(f"{world} rank(s) on the GPU: relative error {err:.2e}, zero copy")
        # Gradients in 16 bits on NCCL, against one process that rounds them.
        for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            want = [p.cpu() for p in test_torch.reference_wire(20, 8, dtype)]
            out = tempfile.mkdtemp(dir=tmp)
            test_torch.run(2, "equivalence", out, "device=cuda", f"grad_dtype={name}", "steps=20")
            err = test_torch.rel(test_torch.result(out, 0)["params"], want)
            assert err < 1e-5, (name, err)
            print(f"grad_dtype {name} on NCCL: relative error {err:.2e} from the rounded reference")
        # torch.cuda.amp.GradScaler itself, rank 1's loss infinite at step 12.
        want, _, scales = test_torch.reference(40, 8, 2, optimizer="adamw", inf_step=12)
        out = tempfile.mkdtemp(dir=tmp)
        test_torch.run(2, "optimizers", out, "device=cuda", "opt=adamw", "steps=40",
                       "inf_step=12", "real_scaler=1")
        for r in (0, 1):
            got = test_torch.result(out, r)
            assert got["skipped"] == [12] and got["scales"] == scales, (got["skipped"], scales)
            err = test_torch.rel(got["params"], [p.cpu() for p in want])
            assert err < 1e-5, err
        print(f"GradScaler on the GPU: step 12 skipped on both ranks, relative error {err:.2e}")
        # Buffers before every forward (host memory staged for NCCL).
        out = tempfile.mkdtemp(dir=tmp)
        test_torch.run(2, "buffers", out, "device=cuda", "bb=1", "steps=3")
        test_torch.check_buffers(out, "1", 3)
        print("broadcast_buffers on NCCL: rank 0's before every forward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
