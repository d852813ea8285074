# Shared by the tests/mpi/*.sh tests: a tiny model on CPU ranks, mpirun flags, failure reporting.
# shellcheck shell=bash
TINY=(backend=cpu config_kwargs.vocab_size=256 config_kwargs.hidden_size=32 config_kwargs.intermediate_size=48
      config_kwargs.num_attention_heads=4 config_kwargs.num_key_value_heads=2
      config_kwargs.max_position_embeddings=64 dataset.max_seq_length=32 dataset.stride=8
      lr_scheduler_kwargs.num_warmup_steps=2 lr_scheduler_kwargs.num_decay_steps=20 logger.frequency=1)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# The pids under process $1 (children first found, then theirs), one per line.
descendants() {
  local queue=("$1") pid child
  while ((${#queue[@]})); do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    for child in $(pgrep -P "$pid"); do
      echo "$child"
      queue+=("$child")
    done
  done
}
# The pid of world rank $2 under mpirun $1. Looks at every descendant (launchers may put a daemon between) and
# retries for 10 s. grep reads the file itself: `tr | grep -q` under pipefail fails when grep quits before tr
# has written all (SIGPIPE, status 141): the cause of a CI failure that found "no process of world rank 1".
rank_pid() {
  local pid try
  for ((try = 0; try < 100; try++)); do
    for pid in $(descendants "$1"); do
      if grep -qxz "OMPI_COMM_WORLD_RANK=$2" "/proc/$pid/environ" 2>/dev/null; then
        echo "$pid"
        return 0
      fi
    done
    sleep 0.1
  done
  echo "no process with OMPI_COMM_WORLD_RANK=$2 under $1; its processes:" >&2
  ps -o pid,ppid,stat,etime,cmd --pid "$1" --ppid "$1" >&2
  return 1
}
# SIGKILLs process $1 and everything under it: killing mpirun alone can leave its ranks writing into a
# directory the test is about to remove.
kill_tree() {
  local pids pid
  pids=$(descendants "$1")
  kill -KILL "$1" $pids 2>/dev/null
  for pid in "$1" $pids; do wait_gone "$pid" 5; done
}
# Waits up to $2 seconds for process $1 to end; status 1 if it is still there.
wait_gone() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}
