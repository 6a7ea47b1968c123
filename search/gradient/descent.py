"""Gradient search over the relaxed plan.

Each restart holds logits ``[L, S]``; the plan is ``softmax(masked logits /
temperature)`` (:mod:`search.gradient.relax`), costed by
:func:`costmodels.iteration_time` and :func:`costmodels.memory_per_device`
(exact at one-hot probabilities). The memory limit enters as an
augmented-Lagrangian term (Rockafellar 1973; Nocedal and Wright §17.4) on
``g = memory / limit - 1 <= 0``:

``loss = time / time_scale + (relu(lambda + rho g)^2 - lambda^2) / (2 rho)``

Adam (optax) runs ``inner_steps`` steps inside a ``lax.scan``; after each
inner loop the multiplier is updated, ``lambda <- relu(lambda + rho g)``,
and ``rho`` grows (an outer ``lax.scan``). The temperature anneals
geometrically over all steps, so the restarts end near one-hot plans.
Several random restarts run side by side (``vmap``) in one call, and
:func:`relaxed_search` also takes a batch of cost tables (mesh shapes,
through ``lax.map``), so one compilation serves every problem of one
bucketed size and batch.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from costmodels import iteration_time, memory_per_device
from search.gradient.relax import relaxed_probs, round_probs, temperature_at

__all__ = ["GradientConfig", "GradientState", "RelaxedResult", "relaxed_search"]


@dataclasses.dataclass(frozen=True)
class GradientConfig:
    """Static settings of the gradient search (hashable: one compilation each)."""

    restarts: int = 8  # random restarts, run side by side
    outer_steps: int = 8  # augmented-Lagrangian multiplier updates
    inner_steps: int = 15  # Adam steps between multiplier updates
    learning_rate: float = 0.2
    temperature_start: float = 1.0
    temperature_end: float = 0.02
    penalty_start: float = 10.0  # rho at the first outer step
    penalty_growth: float = 2.0  # rho multiplies by this each outer step
    penalty_spread: float = 1.0  # restart r starts at penalty_start * penalty_spread ** (r % 3)
    init_scale: float = 1.0  # std of the random initial logits (restart 0 starts uniform)
    gumbel: bool = False  # Gumbel-softmax samples instead of the plain softmax
    restarts_per_step: int = 0  # restarts vmapped together (0 = all of them); the rest go through lax.map
    tables_per_step: int = 1  # tables vmapped together inside the lax.map over a batch of tables

    def __post_init__(self) -> None:
        for name in ("restarts", "outer_steps", "inner_steps", "tables_per_step"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GradientConfig.{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("learning_rate", "temperature_start", "temperature_end", "penalty_start"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"GradientConfig.{name} must be positive, got {getattr(self, name)}")
        if self.penalty_growth < 1:
            raise ValueError(f"GradientConfig.penalty_growth must be at least 1, got {self.penalty_growth}")
        if self.restarts_per_step < 0:
            raise ValueError(f"GradientConfig.restarts_per_step must be non-negative, got {self.restarts_per_step}")
        if self.init_scale < 0:
            raise ValueError(f"GradientConfig.init_scale must be non-negative, got {self.init_scale}")


class GradientState(NamedTuple):
    """The optimisation state of one restart."""

    logits: jnp.ndarray  # [L, S]
    opt_state: optax.OptState
    multiplier: jnp.ndarray  # [] lambda
    penalty: jnp.ndarray  # [] rho
    step: jnp.ndarray  # [] int32, Adam steps taken


class RelaxedResult(NamedTuple):
    """The end of a gradient search, per restart (leading batch axes as given)."""

    logits: jnp.ndarray  # [R, L, S]
    probs: jnp.ndarray  # [R, L, S] at the final temperature
    choice: jnp.ndarray  # [R, L] rounded plan
    time_s: jnp.ndarray  # [R] relaxed iteration time at the final temperature
    memory_bytes: jnp.ndarray  # [R] relaxed memory at the final temperature
    multiplier: jnp.ndarray  # [R] final lambda
    trace_time_s: jnp.ndarray  # [outer, R] relaxed time after each outer step
    trace_memory_bytes: jnp.ndarray  # [outer, R] relaxed memory after each outer step


def _time_scale(table):
    """Sum over real layers of the fastest strategy's layer time: a positive
    normaliser that makes the loss O(1) whatever the model's size."""
    lt = jnp.where(table.feasible, table.layer_time_s, jnp.inf)
    best = jnp.where(table.layer_mask > 0, jnp.min(lt, axis=-1), 0.0)
    return jax.lax.stop_gradient(jnp.sum(best) + 1e-12)


def _run_restart(table, limit, init, noise_key, penalty0, config: GradientConfig):
    """One restart: the augmented-Lagrangian loop from logits ``init`` [L, S]."""
    L, S = table.feasible.shape
    total = config.outer_steps * config.inner_steps
    scale = _time_scale(table)
    opt = optax.adam(config.learning_rate)

    def cost(logits, tau, noise):
        p = relaxed_probs(logits + noise, table.feasible, tau)
        return iteration_time(table, p), memory_per_device(table, p)

    def loss(logits, tau, noise, lam, rho):
        t, mem = cost(logits, tau, noise)
        g = mem / limit - 1.0
        return t / scale + (jnp.square(jax.nn.relu(lam + rho * g)) - jnp.square(lam)) / (2.0 * rho)

    def inner(state: GradientState, _):
        tau = temperature_at(state.step, total, config.temperature_start, config.temperature_end)
        if config.gumbel:
            noise = jax.random.gumbel(jax.random.fold_in(noise_key, state.step), (L, S), jnp.float32)
        else:
            noise = jnp.zeros((L, S), jnp.float32)
        grads = jax.grad(loss)(state.logits, tau, noise, state.multiplier, state.penalty)
        updates, opt_state = opt.update(grads, state.opt_state, state.logits)
        return state._replace(logits=optax.apply_updates(state.logits, updates), opt_state=opt_state,
                              step=state.step + 1), None

    def outer(state: GradientState, _):
        state, _ = jax.lax.scan(inner, state, None, length=config.inner_steps)
        tau = temperature_at(state.step - 1, total, config.temperature_start, config.temperature_end)
        t, mem = cost(state.logits, tau, 0.0)
        lam = jax.nn.relu(state.multiplier + state.penalty * (mem / limit - 1.0))
        state = state._replace(multiplier=lam, penalty=state.penalty * config.penalty_growth)
        return state, (t, mem)

    state = GradientState(
        logits=init, opt_state=opt.init(init), multiplier=jnp.zeros((), jnp.float32),
        penalty=jnp.asarray(penalty0, jnp.float32), step=jnp.asarray(0, jnp.int32),
    )
    state, (trace_t, trace_mem) = jax.lax.scan(outer, state, None, length=config.outer_steps)
    probs = relaxed_probs(state.logits, table.feasible, config.temperature_end)
    return RelaxedResult(
        logits=state.logits, probs=probs, choice=round_probs(probs, table.feasible),
        time_s=iteration_time(table, probs), memory_bytes=memory_per_device(table, probs),
        multiplier=state.multiplier, trace_time_s=trace_t, trace_memory_bytes=trace_mem,
    )


def _search_one(table, memory_limit, key, config: GradientConfig) -> RelaxedResult:
    """All restarts of one table (restart 0 starts from uniform logits)."""
    R = config.restarts
    L, S = table.feasible.shape
    limit = jnp.asarray(memory_limit, jnp.float32)
    k_init, k_noise = jax.random.split(key)
    init = config.init_scale * jax.random.normal(k_init, (R, L, S), jnp.float32)
    init = init.at[0].set(0.0)
    noise_keys = jax.random.split(k_noise, R)
    # optionally, restarts cycle through penalty strengths (weak ones end near the
    # fastest plans that almost fit, strong ones well inside the limit)
    penalty0 = config.penalty_start * config.penalty_spread ** (jnp.arange(R) % 3).astype(jnp.float32)
    chunk = config.restarts_per_step or R
    res = jax.lax.map(lambda a: _run_restart(table, limit, a[0], a[1], a[2], config), (init, noise_keys, penalty0),
                      batch_size=chunk if chunk > 1 else None)
    # traces as [outer, R]
    return res._replace(trace_time_s=res.trace_time_s.T, trace_memory_bytes=res.trace_memory_bytes.T)


@functools.partial(jax.jit, static_argnames=("config",))
def relaxed_search(tables, memory_limits, keys, config: GradientConfig = GradientConfig(), active=None) -> RelaxedResult:
    """Gradient search on a batch of cost tables (leading axis ``K``, e.g.
    mesh shapes of one model), each with its memory limit ``[K]`` (bytes;
    ``inf`` for none) and PRNG key ``[K]``. Returns a :class:`RelaxedResult`
    with leading axes ``[K, R]``. One compilation per (bucketed) table
    shape, ``K`` and ``config``. Tables whose ``active [K]`` flag is false
    are skipped (their results are zeros), so a caller can keep ``K`` fixed.

    The restarts of a table are vmapped (``config.restarts_per_step`` at a
    time, all by default); the tables go through ``lax.map``,
    ``config.tables_per_step`` at a time (one by default: on the CPU,
    vmapping over tables as well was measured slower)."""
    K = memory_limits.shape[0]
    active = jnp.ones(K, bool) if active is None else active

    def one(a):
        table, limit, key, on = a
        run = lambda: _search_one(table, limit, key, config)  # noqa: E731
        shape = jax.eval_shape(run)
        return jax.lax.cond(on, run, lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape))

    return jax.lax.map(one, (tables, memory_limits, keys, active),
                       batch_size=config.tables_per_step if config.tables_per_step > 1 else None)
