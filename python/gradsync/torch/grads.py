"""The model bound to the packs: every parameter's `.data` and `.grad`
become views of pack memory (zero copy: autograd accumulates into the
packs), and a hook on each parameter reports its gradient final to the
engine, which begins the step at the first and starts each pack's
allreduce once its gradients are in. The hook is the step's per-gradient
cost in Python: one identity check and one call into the engine."""
import torch


def device_config(device):
    """cpu with the host backend; a GPU with NCCL, the engine's device work
    queued on PyTorch's current stream (so they need no events)."""
    if device.type == "cpu":
        return {"device": "cpu", "backend": "host"}
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index).cuda_stream
    return {"device": f"cuda:{index}", "backend": "nccl",
            "cuda_stream": stream or 1}  # 1: cudaStreamLegacy, the default stream


def view(device, buf, shape):
    """A tensor over engine memory (a Buffer): host memory through the
    buffer protocol, GPU memory through __cuda_array_interface__."""
    if device.type == "cpu":
        return torch.frombuffer(buf, dtype=torch.float32).view(shape)
    return torch.as_tensor(buf, device=device).view(shape)


def bind(opt):
    """Every parameter's data and grad become views of pack memory (rank
    0's values are copied in by sync_initial); the engine's verdict of a
    step's sums, a view too (a loss scaler's found_inf takes it)."""
    e = opt._engine
    opt._follow_world()
    opt._param_views, opt._grad_views = [], []
    with torch.no_grad():
        for i, p in enumerate(opt.params):
            pv = view(opt.device, e.param(i), p.shape)
            gv = view(opt.device, e.grad(i), p.shape)
            pv.copy_(p.data)
            gv.zero_()
            p.data = pv
            p.grad = gv
            opt._param_views.append(pv)
            opt._grad_views.append(gv)
    opt._verdict = view(opt.device, e.verdict(), (1,))
    opt._shard_grads = shard_views(opt)


def shard_views(opt):
    """The parts of the gradients this rank reduces: with shard_optimizer
    its shard of each (empty ones left out), else every gradient whole."""
    out = []
    for i, gv in enumerate(opt._grad_views):
        first, count = opt._engine.window(i)
        if count == gv.numel():
            out.append(gv)
        elif count:
            out.append(gv.view(-1)[first:first + count])
    return out


def hook(opt, i, p):
    """Reports parameter i's gradient final once autograd has accumulated
    it (PyTorch 2.1's post-accumulate hook, else the hook of its
    AccumulateGrad node). Inside no_sync() it only notes the accumulation."""
    gv, grad_ready = opt._grad_views[i], opt._engine.grad_ready

    def ready(*_):
        if p.grad is not gv:
            into_pack(opt, i)
        if opt._accumulating:
            opt._accumulated = True
        else:
            opt._in_step = True
            grad_ready(i)
    if hasattr(p, "register_post_accumulate_grad_hook"):
        return p.register_post_accumulate_grad_hook(ready)
    acc = p.expand_as(p).grad_fn.next_functions[0][0]
    opt._keep_nodes = getattr(opt, "_keep_nodes", []) + [acc]  # the node outlives the hook
    return acc.register_hook(ready)


def into_pack(opt, i):
    """set_to_none zeroing, or a .grad of the user's: one copy into the
    pack, and the pack's view is the gradient again."""
    p, gv = opt.params[i], opt._grad_views[i]
    with torch.no_grad():
        if p.grad is None:
            gv.zero_()
        else:
            gv.copy_(p.grad)
    p.grad = gv
    opt.copies += 1
