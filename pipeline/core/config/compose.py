"""Hydra composition: params.yaml (or conf/ when a config group is chosen) with the command line's
overrides, as Hydra composes it. Whatever goes wrong on the way is one ConfigError that says what to
write instead, told apart by Hydra's and OmegaConf's exception types."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from pipeline.core.config.defaults import CONF_DIR, CONFIG_GROUPS, PARAMS_FILE, default_values
from pipeline.core.config.messages import unknown_key_message
from pipeline.core.config.yaml_file import load_checked
from pipeline.core.errors import ConfigError


def compose_raw(overrides: Sequence[str] = (), params_file: Path | None = None) -> tuple[DictConfig, str]:
    """What load_config validates, as Hydra composes it (a key the files lack is absent, not yet
    filled from conf/config.yaml), and where it came from."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException

    overrides = list(overrides)
    _check_text(overrides)
    _refuse_hydra_settings(overrides)
    params_file = Path(params_file) if params_file else PARAMS_FILE
    groups = {o.split("=", 1)[0].lstrip("+~") for o in overrides} & set(CONFIG_GROUPS)
    use_conf = bool(groups)
    if use_conf and "preset" not in groups:
        # `fault=nan_loss` alone: compose conf/ with the preset params.yaml was made from.
        overrides.insert(0, f"preset={_params_preset(params_file)}")
    config_dir, config_name = (CONF_DIR, "config") if use_conf else (params_file.parent, params_file.stem)
    if not (config_dir / f"{config_name}.yaml").is_file():
        raise ConfigError(f"{config_dir / (config_name + '.yaml')} not found: run from a checkout of the project")
    _check_group_choices(overrides)
    load_checked(config_dir / f"{config_name}.yaml")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            raw = compose(config_name=config_name, overrides=overrides)
    except OverrideParseException as e:
        raise ConfigError(
            f"cannot parse the override {e.override!r}: Hydra reads the value as an expression, and "
            "characters such as ; , [ ] { } ( ) = need quotes around it, e.g. "
            "embed.delimiter=';' (in a shell: \"embed.delimiter=';'\")"
        ) from None
    except ConfigCompositionException as e:
        # Hydra's "Could not override 'embed.foo'. To append to your config use +embed.foo=1" sends
        # the user to a second error (the schema has no such key): say which keys there are.
        if isinstance(e.__cause__, (ConfigAttributeError, ConfigKeyError)):
            # The override's whole key: full_key is the first part the config lacks (embed.foo of embed.foo.bar).
            missing = e.__cause__.full_key
            keys = [o.split("=", 1)[0] for o in overrides if not o.startswith(("+", "~"))]
            key = next((k for k in keys if k == missing or k.startswith(f"{missing}.")), missing)
            if not use_conf and OmegaConf.select(default_values(), key) is not None:
                raise ConfigError(_absent_key_message(params_file, key)) from None
            raise ConfigError(unknown_key_message(key)) from None
        raise ConfigError(f"bad override in {overrides}: {str(e).splitlines()[0]}") from None
    except HydraException as e:
        raise ConfigError(f"bad override in {overrides}: {str(e).splitlines()[0]}") from None
    except (ValueError, TypeError, AssertionError, KeyError) as e:
        # Hydra's internals on an override its grammar let through (preset=${oc.decode:'[1]'}):
        # still the command line's fault, named as such.
        raise ConfigError(
            f"bad override in {overrides}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    return raw, str(params_file if not use_conf else config_dir)


def _params_preset(params_file: Path) -> str:
    try:
        preset = load_checked(params_file)["run"]["preset"]
    except Exception:  # noqa: BLE001 - a missing or odd params.yaml: the default preset
        return "default"
    return str(preset) if (CONF_DIR / "preset" / f"{preset}.yaml").is_file() else "default"


def _check_group_choices(overrides: Sequence[str]) -> None:
    """`preset=NAME` / `fault=NAME` must name a file of conf/<group>/: anything else (a typo, a
    value Hydra parses as a number or a list: fault=nan, preset=[a]) is named with the choices."""
    for override in overrides:
        key, eq, value = override.lstrip("+~").partition("=")
        if key not in CONFIG_GROUPS or not eq:
            continue
        known = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
        if value not in known:
            close = [k for k in known if value and k.startswith(value)] or difflib.get_close_matches(value, known, n=1)
            hint = f" (did you mean {key}={close[0]}?)" if close else ""
            raise ConfigError(
                f"{key}={value}: there is no conf/{key}/{value}.yaml{hint}; expected one of: {', '.join(known)}"
            )


def _check_text(overrides: Sequence[str]) -> None:
    """An override must be text: bytes that are not UTF-8 reach Python as lone surrogates
    (surrogateescape), which Hydra's grammar rejects as if the override needed quotes."""
    for override in overrides:
        try:
            override.encode("utf-8")
        except UnicodeEncodeError as e:
            try:
                raw = override.encode("utf-8", "surrogateescape")
                what = f"byte 0x{override[e.start].encode('utf-8', 'surrogateescape')[0]:02x}"
            except UnicodeEncodeError:  # a surrogate no byte stands for (not from a command line)
                raw, what = override.encode("utf-8", "backslashreplace"), "a lone surrogate"
            shown = raw.decode("utf-8", "backslashreplace")
            raise ConfigError(
                f"the override '{shown}' (key '{override.partition('=')[0]}') is not UTF-8 text: {what} at "
                f"character {e.start + 1}; write its value in UTF-8 (the shell's or script's encoding)"
            ) from None


def _refuse_hydra_settings(overrides: Sequence[str]) -> None:
    """Hydra's own settings (hydra.job.chdir, hydra.run.dir, hydra/launcher=...) are accepted by
    Hydra's compose API and then do nothing: a stage composes its config, it is not a Hydra job
    (no output directory, no change of directory, no launcher or sweeper). Refused, not ignored."""
    for override in overrides:
        key = override.partition("=")[0].lstrip("+~")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise ConfigError(
                f"the override '{override}' sets Hydra's own setting '{key}', which the stages do not use: they "
                "compose their config with Hydra but do not run as Hydra jobs (no job output directory, no "
                "change of working directory: a stage runs in the project root and writes only its declared "
                "outputs; sweeps are DVC's: dvc exp run --queue -S 'KEY=A,B'). Remove it"
            )


def _absent_key_message(params_file: Path, key: str) -> str:
    """A known key that params.yaml lacks cannot be overridden there: the file is not what conf/ composes."""
    section = key.split(".")[0]
    try:
        doc = load_checked(params_file)
    except ConfigError as e:
        return str(e)
    missing = f"its section '{section}' is missing or empty" if not doc.get(section) else "the key is missing"
    return (
        f"{params_file}: cannot override '{key}': {missing} (params.yaml holds every key, as conf/ composes it); "
        f"restore it with `git checkout {params_file.name}`, or compose conf/ instead by adding preset=NAME "
        "(e.g. preset=default) to the overrides"
    )
