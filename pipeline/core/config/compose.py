"""Hydra composition: params.yaml (or conf/ when a config group is chosen) with the command line's
overrides, as Hydra composes it. Whatever goes wrong on the way is one ConfigError that says what to
write instead, told apart by Hydra's and OmegaConf's exception types."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from pipeline.core.config.defaults import CONF_DIR, CONFIG_GROUPS, PARAMS_FILE
from pipeline.core.config.messages import unknown_key_message
from pipeline.core.config.schema import Config
from pipeline.core.errors import ConfigError


def compose_raw(overrides: Sequence[str] = (), params_file: Path | None = None) -> tuple[DictConfig, str]:
    """What load_config validates, as Hydra composes it (a key the files lack is absent, not yet
    filled from conf/config.yaml), and where it came from."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException

    overrides = list(overrides)
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
    _check_yaml(config_dir / f"{config_name}.yaml")
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
            raise ConfigError(unknown_key_message(e.__cause__.full_key)) from None
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
        preset = OmegaConf.load(params_file).run.preset
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


def _check_yaml(path: Path) -> None:
    """A YAML file that does not parse into a mapping of sections is named with its line, not a
    traceback from deep inside Hydra (an edited params.yaml, a merge conflict left in it)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{path}: not valid YAML{where} ({problem}); expected the sections run, embed, model, train, "
            f"... as in conf/config.yaml (`git diff {path.name}` shows what changed)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(f"{path}: holds a {type(doc).__name__}, expected a mapping of sections (run, embed, ...)")
    for section, value in (doc or {}).items():
        if section in Config.__dataclass_fields__ and value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"{path}: section '{section}' is {value!r}, expected a mapping of its keys "
                f"({', '.join(sorted(OmegaConf.structured(Config)[section].keys())[:6])}, ...)"
            )
