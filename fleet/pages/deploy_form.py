"""The form behind the new-model and edit-profile pages: the catalog file's fields as a person
fills them in, made into a ``ModelEntry`` and checked by the file's own rules
(``catalog.schema``), each problem filed under the field it names.

Every field is text and an empty one is left out of the entry, so a default is the
schema's, said once there; the form only splits lists and lines.
"""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from pydantic import BaseModel, ValidationError

from catalog.models import KNOWN_ENGINES, LAUNCH_MODES, STRATEGIES, Model, Pool, Profile
from catalog.plan import export_catalog
from catalog.schema import AutoscaleEntry, ModelEntry, ProfileEntry, RolloutEntry, _describe
from protocol.routing import ROUTING_POLICIES
from protocol.units import format_duration

# (block, field): the fields inside the profile's rollout: and autoscale: blocks.
BLOCKS = {
    "rollout_surge": ("rollout", "surge"),
    "rollout_unavailable": ("rollout", "unavailable"),
    "autoscale_min": ("autoscale", "min"),
    "autoscale_max": ("autoscale", "max"),
    "autoscale_target_inflight": ("autoscale", "target_inflight"),
    "autoscale_scale_down_after": ("autoscale", "scale_down_after"),
}
LISTS = ("serves", "aliases")
FORM = "form"


def _default(name: str, entry: type[BaseModel] = ProfileEntry) -> str:
    """A field's default as the form shows it, from the schema."""
    value = entry.model_fields[name].default
    if name in ("startup_timeout", "drain_timeout", "scale_down_after"):
        return format_duration(value)
    return str(value)


def _text(label: str, help_text: str = "", initial: str = "", **kwargs) -> forms.CharField:
    return forms.CharField(
        label=label, help_text=help_text, initial=initial, required=False, strip=True, **kwargs
    )


def _choices(values) -> list[tuple[str, str]]:
    return [(value, value) for value in values]


class ProfileFields(forms.Form):
    """One profile's fields, named as in a catalog file (``rollout_surge`` is rollout.surge)."""

    profile = _text("Profile", "its name within the model, like cpu or h100", "default")
    engine = forms.ChoiceField(label="Engine", choices=_choices(KNOWN_ENGINES))
    engine_version = _text(
        "Engine version", "empty: the catalog's newest, else the newest on the chosen node"
    )
    args = _text("Engine arguments", "as on a command line: --threads 2 --jinja", "")
    env = _text("Environment", "NAME=value, one a line", widget=forms.Textarea(attrs={"rows": 2}))
    serves = _text("Serves", "comma-separated: chat, embeddings, rerank…; empty: chat")
    context = _text("Context", "tokens; 0: the engine's own default", _default("context"))
    launch_mode = forms.ChoiceField(
        label="Launch mode", choices=_choices(LAUNCH_MODES), initial=_default("launch_mode")
    )
    replicas = _text("Replicas", "how many copies serve it", _default("replicas"))
    memory = _text("RAM per rank", "host memory, like 512MiB; empty: the model file's estimate")
    gpu_memory = _text("GPU memory", "free on each GPU, like 40GiB; empty: the estimate")
    disk = _text("Disk", "for the weights, like 20GiB; empty: none declared")
    gpus_per_rank = _text("GPUs per rank", "0: runs on CPU", _default("gpus_per_rank"))
    tensor_parallel = _text("Tensor parallel", "", _default("tensor_parallel"))
    nodes = _text("Nodes per replica", "above 1 splits each replica over nodes", _default("nodes"))
    pool = forms.ChoiceField(label="Pool", required=False)
    strategy = forms.ChoiceField(
        label="Strategy", choices=_choices(STRATEGIES), initial=_default("strategy"),
        help_text="pack fills nodes; spread puts replicas on different nodes",
    )  # fmt: skip
    routing = forms.ChoiceField(
        label="Routing", choices=_choices(ROUTING_POLICIES), initial=_default("routing")
    )
    concurrency = _text(
        "Concurrency", "requests one replica serves at once; 0: no limit", _default("concurrency")
    )
    startup_timeout = _text("Startup timeout", "like 10m", _default("startup_timeout"))
    drain_timeout = _text("Drain timeout", "like 30s", _default("drain_timeout"))
    rollout_surge = _text(
        "Rollout surge", "new replicas started beside the old ones", _default("surge", RolloutEntry)
    )
    rollout_unavailable = _text(
        "Rollout unavailable", "old replicas stopped before their replacement is ready",
        _default("unavailable", RolloutEntry),
    )  # fmt: skip
    autoscale_max = _text("Autoscale up to", "replicas; empty: a fixed count")
    autoscale_min = _text("Autoscale down to", f"empty: {_default('min', AutoscaleEntry)}")
    autoscale_target_inflight = _text(
        "Target in flight", f"per replica; empty: {_default('target_inflight', AutoscaleEntry)}"
    )
    autoscale_scale_down_after = _text(
        "Scale down after", f"empty: {_default('scale_down_after', AutoscaleEntry)}"
    )

    groups: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("Engine", ("profile", "engine", "engine_version", "args", "env", "serves", "context",
                    "launch_mode")),
        ("Resources", ("replicas", "memory", "gpu_memory", "disk", "gpus_per_rank",
                       "tensor_parallel", "nodes", "pool", "strategy")),
        ("Serving", ("routing", "concurrency", "startup_timeout", "drain_timeout",
                     "rollout_surge", "rollout_unavailable")),
        ("Autoscaling", ("autoscale_max", "autoscale_min", "autoscale_target_inflight",
                         "autoscale_scale_down_after")),
    )  # fmt: skip
    # Where this form's profile sits in the model's profiles, to file pydantic's errors.
    profile_index = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        pool = self.fields["pool"]
        assert isinstance(pool, forms.ChoiceField)
        pool.choices = [("", "any node"), *_choices(Pool.objects.values_list("name", flat=True))]

    def field_groups(self) -> list[tuple[str, list[forms.BoundField]]]:
        return [(title, [self[name] for name in names]) for title, names in self.groups]

    def profile_data(self) -> dict[str, Any]:
        """The profile as a catalog file would write it (only the fields filled in)."""
        cleaned = self.cleaned_data
        data: dict[str, Any] = {"name": cleaned.get("profile", ""), "engine": cleaned.get("engine")}
        for name in ProfileEntry.model_fields:
            value = cleaned.get(name, "")
            if name in ("name", "engine") or name not in self.fields or value == "":
                continue
            if name == "args":
                value = self._split_args(value)
            elif name == "env":
                value = self._env_lines(value)
            elif name in LISTS:
                value = _list(value)
            data[name] = value
        for field, (block, key) in BLOCKS.items():
            if cleaned.get(field, "") != "":
                data.setdefault(block, {})[key] = cleaned[field]
        return data

    def _split_args(self, text: str) -> list[str]:
        try:
            return shlex.split(text)
        except ValueError as exc:
            self.add_error("args", f"cannot split {text!r} into arguments: {exc}")
            return []

    def _env_lines(self, text: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep or not name.strip():
                self.add_error("env", f"{line.strip()!r} is not NAME=value")
                continue
            env[name.strip()] = value.strip()
        return env

    def check(self, data: dict[str, Any]) -> ModelEntry | None:
        """The model ``data`` describes, or None with every problem on the form (the form's
        own and the schema's together, so that one pass shows them all)."""
        try:
            entry = ModelEntry.model_validate(data)
            return None if self.errors else entry
        except ValidationError as exc:
            for error in exc.errors():
                field = self._field_at(error["loc"])
                if field is None:
                    # Not one of this form's fields: say where, as a catalog file's error would.
                    self.add_error(None, _describe(FORM, data, error).removeprefix(f"{FORM}: "))
                elif error["type"] == "missing":
                    self.add_error(field, "this is required")
                else:
                    self.add_error(field, error["msg"].removeprefix("Value error, "))
        return None

    def _field_at(self, loc: tuple) -> str | None:
        if loc and loc[0] == "profiles":
            if len(loc) < 3 or loc[1] != self.profile_index:
                return None
            name = "profile" if loc[2] == "name" else str(loc[2])
            if name in ("rollout", "autoscale"):
                name = f"{name}_{loc[3]}" if len(loc) > 3 else ""
        else:
            name = str(loc[0]) if loc else ""
        return name if name in self.fields else None

    def add_problems(self, problems: list[str]) -> None:
        """File the catalog verb's refusals ("…: profiles[0] (cpu): pool: …") by field."""
        for problem in problems:
            parts = problem.split(": ")
            profiles = [i for i, part in enumerate(parts) if part.startswith("profiles[")]
            at = profiles[-1] + 1 if profiles else 0
            name = parts[at] if at < len(parts) - 1 else ""
            name = "profile" if name == "name" and profiles else name
            if name in self.fields:
                self.add_error(name, ": ".join(parts[at + 1 :]))
            else:
                self.add_error(None, problem)


class NewModelForm(ProfileFields):
    """A model and its first profile: the new-model page."""

    name = _text("Name", "what clients ask for, like smollm2-135m")
    source = _text(
        "Source", "an absolute path on the nodes, an https:// URL of one file, or a hub id "
        "like org/repo",
    )  # fmt: skip
    aliases = _text("Aliases", "other names clients may use, comma-separated")
    description = _text("Description")
    sha256 = _text("SHA-256", "of the weights file, checked after download; empty: unchecked")

    groups = (
        ("Model", ("name", "source", "aliases", "description", "sha256")),
        *ProfileFields.groups,
    )

    def entry(self) -> ModelEntry | None:
        """The model and profile filled in, or None with every problem on the form."""
        self.full_clean()
        data: dict[str, Any] = {
            name: _list(value) if name in LISTS else value
            for name in ("name", "source", "aliases", "description", "sha256")
            if (value := self.cleaned_data.get(name))
        }
        data["profiles"] = [self.profile_data()]
        return self.check(data)


class EditProfileForm(ProfileFields):
    """One existing profile; the model keeps its other profiles as they are."""

    def __init__(self, profile: Profile, *args, **kwargs) -> None:
        self.model_data = current_model_data(profile.model)
        names = [item["name"] for item in self.model_data.get("profiles", [])]
        self.profile_index = names.index(profile.name)
        current = self.model_data["profiles"][self.profile_index]
        kwargs.setdefault("initial", profile_initial(current))
        super().__init__(*args, **kwargs)
        # Renaming is deleting one profile and creating another: not an edit.
        self.fields["profile"].disabled = True

    def entry(self) -> ModelEntry | None:
        """The whole model with this profile as filled in, or None with every problem."""
        self.full_clean()
        profiles = list(self.model_data["profiles"])
        profiles[self.profile_index] = self.profile_data()
        return self.check({**self.model_data, "profiles": profiles})


def current_model_data(model: Model) -> dict[str, Any]:
    """The model as a catalog file writes it (``export_catalog``'s words)."""
    exported = export_catalog().get("models", [])
    return next(item for item in exported if item["name"] == model.name)


def profile_initial(item: dict[str, Any]) -> dict[str, str]:
    """A profile as exported, as the form's initial text."""
    initial: dict[str, str] = {"profile": item["name"], "engine": item["engine"]}
    for name, value in item.items():
        if name in ("name", "engine"):
            continue
        if name == "args":
            initial[name] = shlex.join(value)
        elif name == "env":
            initial[name] = "\n".join(f"{k}={v}" for k, v in value.items())
        elif name in LISTS:
            initial[name] = ", ".join(value)
        elif name in ("rollout", "autoscale") and isinstance(value, dict):
            for key, inner in value.items():
                if key == "scale_down_after" and isinstance(inner, int):
                    inner = format_duration(inner)
                initial[f"{name}_{key}"] = str(inner)
        else:
            initial[name] = str(value)
    return initial


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.replace("\n", ",").split(",") if item.strip()]
