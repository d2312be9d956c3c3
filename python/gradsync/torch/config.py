"""A DistributedOptimizer's engine: its configuration from the optimizer's
arguments and the launcher's environment, the model registered in it
(parameters in named_parameters() order, the groups, the settings every
rank must share), and the Join (start)."""
import torch

from gradsync import _engine
from gradsync._engine import Error
from gradsync.torch import env, grads, groups, layout, state


def _model_parts(model, broadcast_buffers):
    """(named parameters that need a gradient, named buffers, buffer mode)."""
    if isinstance(model, torch.nn.Module):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        model_buffers = list(model.named_buffers())
    else:
        named = [(f"param{i}", p) for i, p in enumerate(model) if p.requires_grad]
        model_buffers = []
    if broadcast_buffers not in (True, False, "mean"):
        raise ValueError(f"broadcast_buffers is True (rank 0's before every forward), "
                         f"'mean' (the ranks' mean) or False, not {broadcast_buffers!r}")
    if not named:
        raise ValueError("the model has no parameter that requires a gradient")
    for n, p in named:
        if p.dtype != torch.float32 or p.device.type not in ("cpu", "cuda"):
            raise Error(f"parameter '{n}' is {p.dtype} on {p.device}: gradsync.torch trains "
                        "float32 parameters on the cpu or one GPU")
    devices = {p.device for _, p in named}
    if len(devices) != 1:
        raise Error(f"the parameters are on several devices ({sorted(map(str, devices))}): "
                    "a rank trains on one")
    mode = {True: "rank0", False: "own", "mean": "mean"}[broadcast_buffers]
    return named, model_buffers, mode


def engine_config(opt, model, a):
    """Makes and starts `opt`'s engine from the constructor's arguments
    `a`; sets the optimizer's device, params, wrapped optimizer and
    groups. Returns (cfg, engine, named params, named buffers, mode)."""
    named, model_buffers, mode = _model_parts(model, a["broadcast_buffers"])
    opt.device = named[0][1].device
    opt._named = named
    opt.params = [p for _, p in named]
    opt.find_unused_parameters = a["find_unused_parameters"]
    lr, optimizer = a["lr"], a["optimizer"]
    scheduled = bool(a["groups"] or a["bias_lr_mult"] != 1.0 or
                     a["bias_weight_decay"] is not None or a["warmup_steps"] or
                     a["schedule"] != "constant")
    if optimizer is None:
        if lr is None:
            raise TypeError("DistributedOptimizer needs lr= (SGD) or optimizer=")
        # With the engine's own schedule and rules (scheduled), the
        # engine's SGD settings decide, and this one only holds the
        # state's format.
        optimizer = torch.optim.SGD(opt.params, lr=lr, momentum=a["momentum"],
                                    weight_decay=a["weight_decay"], nesterov=a["nesterov"])
    elif lr is not None or scheduled:
        raise ValueError("optimizer= carries its own hyperparameters and groups: leave lr, "
                         "groups, the bias rules and the schedule out (use a torch "
                         "lr_scheduler on the optimizer)")
    kind = groups.adopt(opt, optimizer, state.FUSED)
    opt._sharded = bool(a["shard_optimizer"])
    if opt._sharded and opt._wrapped:
        raise Error(f"shard_optimizer=True needs an optimizer the engine runs (SGD, Adam or "
                    f"AdamW): {type(optimizer).__name__} steps itself over whole parameters")
    cfg = dict(env.config())
    cfg.update(optimizer=kind, nonfinite=a["nonfinite"], grad_dtype=layout.grad_dtype(
        a["grad_dtype"]), lr=lr or 0.0, momentum=a["momentum"], weight_decay=a["weight_decay"],
        nesterov=a["nesterov"], reduce=a["reduce"],
        pack_threshold=layout.pack_bytes(a["pack_threshold"]), bcast_period=a["bcast_period"],
        bias_lr_mult=a["bias_lr_mult"], warmup_steps=a["warmup_steps"],
        warmup_factor=a["warmup_factor"], schedule=a["schedule"], step_size=a["step_size"],
        gamma=a["gamma"], total_steps=a["total_steps"], checkpoint_every=a["checkpoint_every"],
        checkpoint_failures=a["checkpoint_failures"], resume=a["resume"],
        join_timeout=a["join_timeout"], comm_timeout=a["comm_timeout"],
        connect_timeout=a["connect_timeout"], coordinator_grace=a["coordinator_grace"],
        rejoin_timeout=a["rejoin_timeout"], elastic_lr=a["elastic_lr"], decide=a["decide"],
        shard_optimizer=opt._sharded, driven=True,
        zero_missing_grads=bool(a["find_unused_parameters"]), **grads.device_config(opt.device))
    if a["bias_weight_decay"] is not None:
        cfg["bias_wd"] = a["bias_weight_decay"]
    if a["checkpoint_dir"]:
        cfg["checkpoint_dir"] = str(a["checkpoint_dir"])
        if model_buffers or opt._wrapped:
            cfg["checkpoint_extra"] = state.extra_saver(model_buffers, opt._inner if opt._wrapped
                                                        else None)
    e = _engine.Engine(**cfg)
    for n, p in named:
        e.register(n, p.numel(), n.endswith("bias"))
    # The torch groups become engine groups, unless the engine's own SGD
    # schedule decides or the wrapped optimizer steps itself.
    opt._groups = groups.Groups(opt._inner, e, not (scheduled or opt._wrapped))
    if opt._groups.in_engine:
        opt._groups.add_to_engine(opt.params)
    groups.add_rules(e, groups.rules(a["groups"] or [], opt.params, named, lr,
                                     a["weight_decay"]))
    for name, value in layout.layout_settings(named):
        e.add_setting(name, value)
    e.add_setting("torch.find-unused", str(bool(a["find_unused_parameters"])).lower())
    e.add_setting("torch.buffers", f"{sum(b.numel() for _, b in model_buffers)}/{mode}")
    try:
        e.start()
    except Error as err:
        raise layout.mismatch(err, named) from None
    return cfg, e, named, model_buffers, mode
