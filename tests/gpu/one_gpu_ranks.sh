#!/usr/bin/env bash
# An --agent-bin for gradsync-run that puts every rank on GPU 0 of this
# machine with the nccl backend. NCCL refuses two ranks of one communicator
# on one GPU of one host, so each rank poses as a host of its own: a
# distinct NCCL_HOSTID, NCCL's socket transport over loopback (no
# InfiniBand, no other interface). For tests and for trying multi-rank NCCL
# on a one-GPU machine; it measures nothing about real GPU-to-GPU links.
#
# usage: gradsync-run --nproc N --agent-bin tests/gpu/one_gpu_ranks.sh ...
# The agent is $GS_AGENT_BIN, else gradsync-agent beside this script, else
# on the PATH. The rank comes from LOCAL_RANK (gradsync-run sets it).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
agent=${GS_AGENT_BIN:-}
if [ -z "$agent" ]; then
  for cand in "$here/gradsync-agent" "$here/../../bin/gradsync-agent"; do
    if [ -x "$cand" ]; then agent=$cand; break; fi
  done
  agent=${agent:-gradsync-agent}
fi
export NCCL_HOSTID="gradsync-rank-${LOCAL_RANK:?LOCAL_RANK is not set (start the ranks with gradsync-run)}"
export NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
# Last: the agent's flags are last-one-wins.
exec "$agent" "$@" --device cuda --backend nccl --gpu 0
