"""Meshes without devices: spec strings, the `ParallelDims` value type, roles, layout algebra, enumeration."""

from kdist.meshes.enumerate import data_model_specs, divisors, meshes, spec_of
from kdist.meshes.roles import BATCH_ROLES, ROLES, RULE_ROLES, WEIGHT_ROLES, Role, role_of_name
from kdist.meshes.spec import AUTO_NEEDS, SPEC_FORMS, MeshSpec, ParallelDims, as_dims, parse_spec

__all__ = [
    "AUTO_NEEDS",
    "BATCH_ROLES",
    "MeshSpec",
    "ParallelDims",
    "ROLES",
    "RULE_ROLES",
    "Role",
    "SPEC_FORMS",
    "WEIGHT_ROLES",
    "as_dims",
    "data_model_specs",
    "divisors",
    "meshes",
    "parse_spec",
    "role_of_name",
    "spec_of",
]
