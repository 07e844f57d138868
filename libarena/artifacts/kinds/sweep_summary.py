"""``sweep_summary``: what became of every simulation of a sweep (sweep.json, written last)."""

from libarena.artifacts.registry import ArtifactKind, Field, register_kind

SWEEP_SUMMARY = register_kind(
    ArtifactKind(
        name="sweep_summary",
        # 2: kind, version and inputs (the spec, cluster, traces and performance tables with their sha256) in the
        # header; version 1 held the version and inputs at the top level
        version=2,
        format="json",
        produced_by="arena-schedule sweep",
        # no summary's bound: about 1.6 KB a simulation, more with a failure's report (read with the bound every
        # artifact has)
        description="Every simulation of a sweep (policies x traces x seeds x ablations): its status, output folder "
                    "and metrics, and the comparisons written.",
        fields=(
            Field("output", "str", "the sweep's output folder"),
            Field("total", "int", "simulations in the sweep"),
            Field("cached", "int", "... restored from the cache"),
            Field("simulated", "int", "... simulated by this run"),
            Field("failed", "int", "... that failed (each with its error in simulations)"),
            Field("comparisons", "dict[str, list]", "comparison folder -> its policies, for every compare.json written"),
            Field("incomplete_comparisons", "list[str]", "comparison folders left without compare.json (a simulation failed)"),
            Field("simulations", "list[dict]", "per simulation: label, group, trace, variant, seed, policy, output, "
                                              "status (cached, simulated, failed), error, detail, metrics (as run_metrics)"),
        ),
    )
)
