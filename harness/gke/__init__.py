"""GKE multi-slice fan-out of the SPMD suite.

Modules, one job each:
    accelerators    the table of TPU types and topologies (the only place sizes live)
    manifest        renders the JobSet from k8s/base plus the table (same files as kustomize)
    kube            the one interface to the Kubernetes API (the `kubernetes` client, retries, watch)
    prerequisites   what the cluster needs before a run: the JobSet CRD, new enough for spec.coordinator
    report_channel  the framed, compressed, checksummed report block in a pod log
    bucket          the worker's optional GCS copy of its report (google-cloud-storage; skipped unless configured)
    hostreport      what one host hands back (placement, how its suite ended, its case records)
    worker          the entrypoint each TPU host runs: the suite, then the report block
    collect         a host's log -> its HostReport, or a failed one saying why
    aggregate       per-host reports -> one JUnit XML, summary, JSON, cross-host sharding check
    launcher        create, watch, collect, clean up
    local           the same worker as local processes (2 slices x H hosts on CPU)
    errors          typed errors; the CLI maps them to exit codes
    __main__        the CLI: `python -m harness.gke run|worker`
"""
