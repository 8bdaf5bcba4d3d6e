"""Runtime layer: PJRT devices through JAX, device storage, transfers, executable cache.

Nothing above this package may assume which PJRT platform is in use.
"""
