"""Clipping and loss scaling over the reduced gradients, decided on the
device: the host never reads a norm, a coefficient or a verdict (torch's
own clip_grad_norm_ and fused AdamW work the same way: a clamped multiply,
found_inf a device tensor). The fused update reads clipping's coefficient
and the scaler's found_inf when it runs (gs_engine_scale_step_at,
gs_engine_skip_step_at); an optimizer the engine does not run gets the
coefficient multiplied into its gradients, and decides on the host
whether to call torch's step (it must)."""
import torch


def clip_grad_norm_(opt, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """torch.nn.utils.clip_grad_norm_ over the reduced gradients: the norm
    of the per-parameter norms, returned as a tensor; the gradients are
    multiplied by min(1, max_norm / (norm + 1e-6)) inside the fused update
    (no pass of its own)."""
    opt._reduce_for_update(None)
    opt._clipped = True
    norm_type = float(norm_type)
    with torch.no_grad():
        if opt._sharded:
            total = sharded_norm(opt, norm_type)
        else:
            norms = [torch.linalg.vector_norm(g, norm_type) for g in opt._grad_views]
            total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        if not opt._scaled:  # the sums: the mean's 1/world is the update's
            total = total * opt._grad_scale()
        if error_if_nonfinite and not torch.isfinite(total):  # a read the caller asked for
            raise RuntimeError(f"the total norm of order {norm_type} of the gradients is "
                               "non-finite, so it cannot be clipped")
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0).to(torch.float32)
        if opt._wrapped:
            for g in opt._grad_views:
                g.mul_(coef)
        else:
            opt._keep.append(coef)  # read by the update: alive until end_step
            opt._engine.scale_step_at(coef.data_ptr())
    return total


def sharded_norm(opt, norm_type):
    """The norm of the reduced gradients from every rank's shards: each
    rank's sum of |g|^p (its maximum for the infinity norm, in its slot of
    a world-long vector) summed over the ranks, on the device."""
    dev, inf = opt.device, norm_type == float("inf")
    parts = [torch.linalg.vector_norm(g, norm_type) for g in opt._shard_grads]
    mine = torch.stack(parts).max() if inf and parts else \
        torch.stack([n ** norm_type for n in parts]).sum() if parts else \
        torch.zeros((), device=dev)
    flat = torch.zeros(opt.world_size if inf else 1, dtype=torch.float32, device=dev)
    flat[opt.rank if inf else 0] = mine
    opt._engine.sum_at(flat.data_ptr(), flat.numel())
    return flat.max() if inf else flat[0] ** (1.0 / norm_type)


def unscale(opt, scaler, loss):
    """A GradScaler's step: the gradients reduced (the means in place),
    then unscaled by the scaler (unless the script did so, with
    scaler.unscale_(opt), before or after opt.synchronize(): the scale is
    linear, so before it too is right), and the scaler's found_inf made
    the verdict of the sums, which every rank holds alike (never this
    rank's own, or ranks would disagree on skipping): with an infinity or
    NaN the step is skipped on every rank, and scaler.update() lowers the
    scale as usual. Returns found_inf (a device tensor)."""
    opt.synchronize(loss)
    state = scaler._per_optimizer_states[id(opt)]
    if state["stage"].name == "READY":
        scaler.unscale_(opt)  # the sums now
    found = state["found_inf_per_device"]
    with torch.no_grad():
        if opt._nonfinite == "off":  # the engine checked nothing: a check here
            finite = torch.stack([g.isfinite().all() for g in opt._shard_grads]).all()
            verdict = (~finite).to(torch.float32)
            if opt._sharded:  # each rank saw its shards: any rank's
                opt._engine.sum_at(verdict.data_ptr(), 1)
                verdict = (verdict > 0).to(torch.float32)
        else:
            verdict = opt._verdict
        for t in found.values():
            t.copy_(verdict)
    found_inf = found.get(opt.device, next(iter(found.values())))
    opt._keep.append(found_inf)
    opt._engine.skip_step_at(found_inf.data_ptr())
    return found_inf


def scaled_step(opt):
    """The wrapped optimizer's own step with each group's lr times the
    engine's factor (the operator's lr scale, elastic_lr's), as the fused
    update applies it: set for the step only, so the script's scheduler
    goes on from its own values."""
    f = opt._lr_factor
    if f == 1.0:
        opt._inner.step()
        return
    saved = [g["lr"] for g in opt._inner.param_groups]
    try:
        for g in opt._inner.param_groups:
            g["lr"] = g["lr"] * f
        opt._inner.step()
    finally:
        for g, lr in zip(opt._inner.param_groups, saved):
            g["lr"] = lr
