"""The experiment scripts, shipped with the package: one module per study or benchmark, each with ``PRESETS``
(``cpu``, ``gpu``, ...) and ``run(config, run_dir)``. Run them with ``jaxrl-reason run <name>`` (``jaxrl-reason
list`` shows them) or as scripts (``python experiments/<name>.py`` in a clone, where ``experiments/`` is a link
to this folder). ``anchors/`` holds the anchor projects' benchmark scripts the ``bench_*`` modules are
measured against (reference copies, not part of the installed package)."""
