#!/usr/bin/env bash
# Submits a libddp job as sbatch does, after asking Slurm whether the request
# can ever start: a job that asks more of a node than any node of the
# partition has (--cpus-per-task x --ntasks-per-node CPUs, --mem, GPUs) or
# more nodes than it holds pends forever (Reason=PartitionConfig, and
# `sbatch --wait` says nothing), unless the cluster sets EnforcePartLimits,
# and a pending job never runs its script, so no check inside a template can
# catch it. `sbatch --test-only` asks the controller without submitting.
#
#   deploy/slurm/submit.sh [sbatch options] TEMPLATE PROGRAM [ARGS...]
#   deploy/slurm/submit.sh -N 2 --cpus-per-task=16 deploy/slurm/ddprun-per-node.sbatch build/examples/lenet_fmnist/lenet_fmnist
#
# Exit status: sbatch's when the job was submitted (with --wait, the job's);
# 1, with Slurm's reason and the partition's nodes on stderr, when Slurm
# would not start the job on the nodes that are up now, and nothing is
# submitted. Nodes that are down or drained count as missing: to queue a job
# for them anyway, run sbatch itself. Any other refusal of --test-only (the
# controller unreachable, a timeout, an account or QOS limit, a mistyped
# option) is printed as Slurm gave it, with sbatch's exit status, and nothing
# is submitted either. SBATCH names another sbatch.
set -uo pipefail
sbatch=${SBATCH:-sbatch}
if (($# == 0)); then
  echo "usage: submit.sh [sbatch options] TEMPLATE PROGRAM [ARGS...]" >&2
  exit 2
fi

answer=$("$sbatch" --test-only "$@" 2>&1)
code=$?
if ((code == 0)); then
  exec "$sbatch" "$@"
fi
reason=$(printf '%s\n' "$answer" | sed -n 's/^allocation failure: //p; s/^sbatch: error: //p' | head -n 1)
# Only these answers say that no node that is up could ever run the job.
case "$answer" in
  *"node configuration is not available"* | *"processors requested than permitted"* | \
    *"Node count specification invalid"* | *"Memory required by task is not available"* | \
    *"Memory specification can not be satisfied"*)
    echo "submit: Slurm would never start this job: ${reason:-$answer}" >&2
    echo "submit: no node that is up has what one node of the job asks for, or there are fewer such nodes than" \
      "--nodes. One node's share: ddprun-per-node.sbatch asks for --cpus-per-task CPUs (its workers share them)," \
      "srun-per-task.sbatch for --ntasks-per-node x --cpus-per-task; plus --mem and GPUs. The partitions' nodes:" >&2
    sinfo -o '  %10P %6D %5c %10m %16G %t' >&2
    echo "submit: lower the request to what a node has (CPUS, MEMORY in MB, GRES; sbatch options override the" \
      "template's #SBATCH lines), see docs/clusters.md, \"Sizing a job\". Nothing was submitted." >&2
    exit 1
    ;;
esac
echo "submit: sbatch --test-only failed (exit status $code); nothing was submitted. Slurm's answer:" >&2
printf '%s\n' "$answer" >&2
exit "$code"
