"""Scheduling policies, one module each, registered by name: arena, fcfs, gavel, elasticflow, elasticflow-ls, sia."""

from libarena.schedule.policies.base import Policy, get_policy, policy_names, register_policy

__all__ = ["Policy", "get_policy", "policy_names", "register_policy"]
