"""What one process runs on: the device (:mod:`~dlscale.runtime.devices`), the precision policy
(:mod:`~dlscale.runtime.precision`: ``auto`` by capability, autocast, a grad scaler only for
fp16) and torch's CPU threads (:mod:`~dlscale.runtime.threads`: from the CPUs the process was given).
"""
