"""Where the processes run: launch command lines (:mod:`~dlscale.jobs.local_ranks`: torchrun,
horovodrun), a Slurm cluster on this machine (:mod:`~dlscale.jobs.local_slurm`), submitting
and waiting for jobs (:mod:`~dlscale.jobs.slurm_jobs`), ranks on ipyparallel engines from a
notebook (:mod:`~dlscale.jobs.notebook_engines`) and the environment report
(:mod:`~dlscale.jobs.environment`, ``dlscale info``).
"""
