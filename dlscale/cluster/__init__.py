"""Where the processes run: launch command lines (:mod:`~dlscale.cluster.launch`: torchrun,
horovodrun), a Slurm cluster on this machine (:mod:`~dlscale.cluster.local_slurm`), submitting
and waiting for jobs (:mod:`~dlscale.cluster.slurm_jobs`), ranks on ipyparallel engines from a
notebook (:mod:`~dlscale.cluster.notebook_engines`) and the environment report
(:mod:`~dlscale.cluster.environment`, ``dlscale info``).
"""
