#!/usr/bin/env bash
# Grade a class on a Slurm cluster: one array task per shard, then a merge job that runs only once
# every shard has finished. Run it on the login node, from the folder holding the submissions:
#
#     LAB=lab2 SHARDS=8 SUBMISSIONS=submissions OUT=grades bash grade-class-slurm.sh
#
# Each array task grades the submissions whose name hashes to its shard (`--shard K/N`), in a
# bubblewrap sandbox per submission (the compute nodes need bubblewrap and user namespaces, and the
# converted model in the cache, readable by all: chmod -R a+rX ~/.cache/labkit). The merge job
# checks every shard's checksums and refuses a shard missing, doubled or altered; a failed shard
# leaves the merge job pending forever (afterok), so `squeue` shows it: re-run that one task.
set -euo pipefail

LAB=${LAB:-lab2}
SHARDS=${SHARDS:-4}
SUBMISSIONS=${SUBMISSIONS:-submissions}
OUT=${OUT:-grades}
JOBS=${JOBS:-4} # submissions graded at a time within a shard, one kernel (and about a core) each

if [[ ${1:-} == shard ]]; then # inside array task K
    labkit grade "$SUBMISSIONS"/*.ipynb --lab "$LAB" --out "$OUT/shard-$SLURM_ARRAY_TASK_ID" \
        --shard "$SLURM_ARRAY_TASK_ID/$SHARDS" --jobs "$JOBS" --cell-timeout 120 --total-timeout 900
elif [[ ${1:-} == merge ]]; then # after every array task succeeded
    labkit grade merge "$OUT"/shard-* --out "$OUT/class"
else # on the login node: submit both
    mkdir -p "$OUT"
    export LAB SHARDS SUBMISSIONS OUT JOBS
    array=$(sbatch --parsable --array="1-$SHARDS" --cpus-per-task="$JOBS" --mem=40G --time=04:00:00 \
        --job-name="grade-$LAB" --output="$OUT/slurm-%A_%a.log" "$0" shard)
    sbatch --dependency="afterok:$array" --time=00:15:00 --job-name="merge-$LAB" \
        --output="$OUT/slurm-merge-%j.log" "$0" merge
    echo "submitted shards as job $array; the merged reports will be in $OUT/class/"
fi
