"""Flash-loader (``flexinfer flash-load``): copy a model directory into tmpfs, in parallel, safely.

The copy of model files from a slow volume (PVC, hostPath) into a fast one (``/dev/shm/...``) before
a backend starts, as the original ``flexinfer-flash-loader`` init container did
(``shared/reference/flexinfer-upstream.md`` §7.2):

1. remove stale ``*.flash-tmp`` files that an interrupted run left under the destination;
2. walk the source (symlinks and special files skipped, excluded prefixes pruned);
3. plan: drop excluded files and, with ``FLASH_VARIANT=fp16``, ``X.safetensors`` whenever
   ``X.fp16.safetensors`` exists; skip files whose destination already has the same size;
4. preflight the free space of the destination (bytes to copy + max(5 %, 10 MiB));
5. copy with a thread pool, each file through the fastest path the kernel offers
   (``copy_file_range`` -> ``sendfile`` -> a buffered read/write loop), written to
   ``<f>.flash-tmp``, fsynced, optionally verified, then renamed over the final name, so a final
   name never holds a partial file;
6. report progress and MB/s (10^6 bytes per second) on stderr.

The parts: :mod:`flexinfer.flashloader.command` (the command and the run that strings the parts
together, :func:`~flexinfer.flashloader.command.flash_load`), :mod:`flexinfer.flashloader.config`
(FLASH_* settings, :class:`~flexinfer.flashloader.config.FlashError`), :mod:`flexinfer.flashloader.plan`
(steps 1-4; the planning is pure) and :mod:`flexinfer.flashloader.transfer` (step 5 for one file).
None of them may import asyncio, Kubernetes clients or anything heavy: it runs as an init container
before anything else.
"""
