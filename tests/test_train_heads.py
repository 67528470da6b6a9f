"""Training beyond plain fine-tuning: dropout, feature heads, on-policy distillation.

Offline, on CPU, with the smoke variants of configs/finetune/bible_head.py and
bible_draft_onpolicy.py against a random d_model-32 target/draft pair on the shipped tokenizer.
"""

import importlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import data, testing
from specjax.errors import ConfigError
from specjax.models import t5


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
  return testing.write_random_pair(tmp_path_factory.mktemp('pair'), data.bible_tokenizer())


def _config(module, arg, workdir, **overrides):
  cfg = importlib.import_module(f'configs.finetune.{module}').get_config(arg)
  cfg.progress = False
  cfg.workdir = str(workdir)
  cfg.data.cache_dir = ''
  cfg.update_from_flattened_dict(overrides)  # 'data.batch_size': 8 sets cfg.data.batch_size
  return cfg


def test_dropout_is_off_at_zero_and_seeded():
  cfg = testing.tiny_config('v11')
  model = testing.tiny_t5(cfg, seed=0)
  ids = jnp.array([[5, 6, 7, 1]], jnp.int32)
  dec = jnp.array([[0, 3, 4, 9]], jnp.int32)
  plain = t5.teacher_forced_logits(model.params, cfg, ids, dec)
  drop = lambda rate, seed: t5.teacher_forced_logits(  # noqa: E731
      model.params, cfg, ids, dec, t5.Dropout(jax.random.PRNGKey(seed), rate))
  np.testing.assert_allclose(drop(0.0, 1), plain, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(drop(0.3, 1), drop(0.3, 1))
  assert float(jnp.max(jnp.abs(drop(0.3, 1) - plain))) > 1e-2
  assert float(jnp.max(jnp.abs(drop(0.3, 1) - drop(0.3, 2)))) > 1e-2
  x = jnp.ones((4000,))
  kept = t5.Dropout(jax.random.PRNGKey(0), 0.25)(x, 0)
  assert abs(float(jnp.mean(kept == 0)) - 0.25) < 0.03  # the rate, and scaled by 1 / (1 - rate)
  np.testing.assert_allclose(float(jnp.max(kept)), 1 / 0.75, rtol=1e-6)


def test_head_training_exports_a_draft_that_decodes_exactly(pair, tmp_path):
  import specjax
  from specjax.decoding.feature_head import FeatureHeadDraft
  from specjax.training import finetune
  target_dir, _ = pair
  cfg = _config('bible_head', 'smoke', tmp_path / 'h', steps=10,
                **{'model.init_from': target_dir, 'data.train_examples': 48,
                   'data.eval_examples': 16, 'bleu_batch_size': 16, 'checkpoint_every': 5})
  res = finetune.train(cfg)
  assert res['steps'] == 10 and 0 < res['dev_alpha'] <= 1 and 0 <= res['dev_top1'] <= 1
  lines = [json.loads(l) for l in (tmp_path / 'h' / 'metrics.jsonl').read_text().splitlines()]
  assert [l['step'] for l in lines if 'train_loss' in l] == [10]
  assert all(np.isfinite(l['train_loss']) for l in lines if 'train_loss' in l)
  # Resumes from the checkpoint at 10 and trains to 14 (the head's own state restored).
  cfg.steps = 14
  res = finetune.train(cfg)
  assert res['steps'] == 14
  assert 'resumed from checkpoint step 10' in (tmp_path / 'h' / 'train.log').read_text()
  target = specjax.load_t5(target_dir)
  draft = FeatureHeadDraft.for_target(target, res['export_dir'])
  ids = np.array([[5, 9, 22, 7, 1], [8, 3, 1, 0, 0]], np.int32)
  base = specjax.autoregressive_decode(target, ids, max_new_tokens=8)
  out = specjax.speculative_decode(target, draft, ids, gamma=3, max_new_tokens=8)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  # The export's vocab.json (the training targets' ids by frequency) cuts a truncated head.
  small = FeatureHeadDraft.for_target(target, res['export_dir'], vocab=50)
  assert small.draft_vocab == 50 and small.vocab_size == target.config.vocab_size
  out = specjax.speculative_decode(target, small, ids, gamma=3, max_new_tokens=8)
  np.testing.assert_array_equal(out.tokens, base.tokens)


def test_fused_head_trains_on_tapped_layers_and_decodes_exactly(pair, tmp_path):
  """configs/finetune/bible_head_fused.py:smoke: the head reads the target's decoder layers 0
  and 1 beside its final state, unrolled 3 passes with decayed weights; the export records the
  taps, reads the wider features and decodes token-identically to greedy."""
  import specjax
  from specjax.decoding.feature_head import FeatureHeadDraft
  from specjax.training import finetune
  target_dir, _ = pair
  cfg = _config('bible_head_fused', 'smoke', tmp_path / 'f', steps=6,
                **{'model.init_from': target_dir, 'data.train_examples': 32,
                   'data.eval_examples': 16, 'bleu_batch_size': 16})
  res = finetune.train(cfg)
  assert res['steps'] == 6 and 0 < res['dev_alpha3'] <= 1 and 0 < res['dev_alpha'] <= 1
  target = specjax.load_t5(target_dir)
  draft = FeatureHeadDraft.for_target(target, res['export_dir'])
  assert draft.config.feature_taps == (0, 1)
  assert draft.params['in_proj'].shape[0] == 4 * target.config.d_model
  ids = np.array([[5, 9, 22, 7, 1], [8, 3, 1, 0, 0]], np.int32)
  base = specjax.autoregressive_decode(target, ids, max_new_tokens=8)
  out = specjax.speculative_decode(target, draft, ids, gamma=3, max_new_tokens=8)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  cfg.head.feature_taps = (0, 2)  # the random target has 2 decoder layers
  cfg.workdir = str(tmp_path / 'g')
  with pytest.raises(ValueError, match='feature taps'):
    finetune.train(cfg)


def test_parallel_blocks_train_and_decode_exactly(pair, tmp_path):
  """configs/finetune/bible_head_parallel.py:smoke trains a head with chained parallel blocks
  (dev alpha per depth logged); a second run from its export with head.freeze_trunk trains
  Medusa-style blocks alone: the trunk comes back bit-identical, the blocks are new, and both
  modes decode exactly."""
  import specjax
  from specjax.decoding.feature_head import FeatureHeadDraft
  from specjax.models import head as head_lib
  from specjax.training import finetune
  target_dir, _ = pair
  common = {'model.init_from': target_dir, 'data.train_examples': 32, 'data.eval_examples': 16,
            'bleu_batch_size': 16}
  res = finetune.train(_config('bible_head_parallel', 'smoke', tmp_path / 'p', steps=6,
                               **common))
  assert res['steps'] == 6 and 0 < res['dev_alpha_d2'] <= 1 and 0 < res['dev_alpha_d3'] <= 1
  first_dir = res['export_dir']
  first, config = head_lib.load_head(first_dir)
  assert config.parallel_depth == 2 and config.parallel_tokens
  assert first['par_in'].shape == (2, 16 + 32, 8)  # the state and the draft's embedding
  assert float(jnp.max(jnp.abs(first['par_out']))) > 0  # the blocks trained from zero
  res = finetune.train(_config('bible_head_parallel', 'smoke,blocks=medusa', tmp_path / 'q',
                               steps=4, **common, **{'head.init_from': res['export_dir'],
                                                     'head.freeze_trunk': True}))
  second, config = head_lib.load_head(res['export_dir'])
  assert not config.parallel_tokens and second['par_in'].shape == (2, 16, 8)
  for name, value in first.items():
    same = value.shape == second[name].shape and np.array_equal(np.asarray(value),
                                                                np.asarray(second[name]))
    assert same == (name not in ('par_in', 'par_out')), name
  assert float(jnp.max(jnp.abs(second['par_out']))) > 0
  vocab = lambda d: (Path(d) / head_lib.VOCAB_NAME).read_text()  # noqa: E731
  assert vocab(res['export_dir']) == vocab(first_dir)  # the frozen trunk keeps its ranking
  # bible_head_continue.py: every parameter trains on from init_from (here two small steps).
  cont = finetune.train(_config('bible_head_continue', 'smoke', tmp_path / 'c', steps=2,
                                **common, **{'head.init_from': first_dir,
                                             'optim.warmup_steps': 1}))
  third, config = head_lib.load_head(cont['export_dir'])
  assert config.parallel_depth == 0 and 'par_in' not in third
  moved = float(jnp.max(jnp.abs(third['in_proj'] - first['in_proj'])))
  assert 0 < moved < 0.1 * float(jnp.max(jnp.abs(first['in_proj'])))
  target = specjax.load_t5(target_dir)
  ids = np.array([[5, 9, 22, 7, 1], [8, 3, 1, 0, 0]], np.int32)
  base = specjax.autoregressive_decode(target, ids, max_new_tokens=8)
  for parallel in (False, True):
    draft = FeatureHeadDraft.for_target(target, res['export_dir'], parallel=parallel)
    out = specjax.speculative_decode(target, draft, ids, gamma=3, max_new_tokens=8)
    np.testing.assert_array_equal(out.tokens, base.tokens)
    assert (int(out.stats.draft_passes) <= int(out.stats.iterations)) == parallel


def test_onpolicy_distillation_lowers_the_divergence(pair, tmp_path):
  from specjax.training import finetune
  target_dir, draft_dir = pair
  cfg = _config('bible_draft_onpolicy', 'smoke', tmp_path / 'o', steps=20, log_every=10,
                **{'model.init_from': draft_dir, 'onpolicy.teacher': target_dir,
                   'data.train_examples': 64, 'data.eval_examples': 16, 'bleu_batch_size': 16,
                   'optim.learning_rate': 1e-2})
  res = finetune.train(cfg)
  lines = [json.loads(l) for l in (tmp_path / 'o' / 'metrics.jsonl').read_text().splitlines()]
  train = [l for l in lines if 'train_loss' in l]
  assert len(train) == 2 and train[1]['train_loss'] < train[0]['train_loss'], train
  # tvd per position is exactly 1 - sum_x min(p, q): the logged alpha is its complement.
  for l in train:
    np.testing.assert_allclose(l['train_loss'] + l['train_alpha'], 1.0, rtol=1e-4)
  assert 0 < res['dev_alpha'] <= 1
  assert 'on-policy distillation (tvd)' in (tmp_path / 'o' / 'train.log').read_text()


def test_divergences_match_their_formulas():
  from specjax.training.distill import divergence
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
  p = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
  q = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
  np.testing.assert_allclose(divergence('tvd', jnp.asarray(a), jnp.asarray(b)),
                             0.5 * np.abs(p - q).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(divergence('tvd', jnp.asarray(a), jnp.asarray(b)),
                             1 - np.minimum(p, q).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(divergence('fkl', jnp.asarray(a), jnp.asarray(b)),
                             (p * np.log(p / q)).sum(-1), rtol=1e-5)


@pytest.mark.parametrize('module,arg,key,value,field', [
    ('bible_head', 'smoke', 'head.d_model', 0, 'config.head.d_model'),
    ('bible_head', 'smoke', 'head.unroll', 0, 'config.head.unroll'),
    ('bible_head', 'smoke', 'head.feature_noise', -1.0, 'config.head.feature_noise'),
    ('bible_head', 'smoke', 'model.init_from', '', 'config.model.init_from'),
    ('bible_head_fused', 'smoke', 'head.unroll_decay', 0.0, 'config.head.unroll_decay'),
    ('bible_head_fused', 'smoke', 'head.feature_taps', (1, 1), 'config.head.feature_taps'),
    ('bible_head_parallel', 'smoke', 'head.parallel_depth', -1, 'config.head.parallel_depth'),
    ('bible_head_parallel', 'smoke', 'head.freeze_trunk', True, 'config.head.freeze_trunk'),
    ('bible_head_parallel', '', 'head.d_model', 64, 'config.head.d_model'),
    ('bible_head_parallel', '', 'head.init_from', './nope', 'config.head.init_from'),
    ('bible_draft_onpolicy', 'smoke', 'onpolicy.divergence', 'rkl', 'config.onpolicy.divergence'),
    ('bible_draft_onpolicy', 'smoke', 'onpolicy.temperature', 0.0, 'config.onpolicy.temperature'),
    ('bible_draft_onpolicy', 'smoke', 'onpolicy.teacher', './nope', 'config.onpolicy.teacher'),
    ('bible_target', 'smoke', 'model.dropout_rate', 1.0, 'config.model.dropout_rate'),
])
def test_bad_config_one_line_error(module, arg, key, value, field, tmp_path):
  from specjax.training import finetune
  cfg = _config(module, arg, tmp_path / 'x', **{key: value})
  with pytest.raises(ConfigError) as e:
    finetune.finetune_spec(cfg)
  msg = str(e.value)
  assert '\n' not in msg and msg.startswith(field + ':'), msg


def test_paper_head_config_validates_offline():
  from specjax.training import finetune
  for arg in ('', 'task=cnndm', 'smoke'):
    cfg = importlib.import_module('configs.finetune.head_t5xxl').get_config(arg)
    spec = finetune.finetune_spec(cfg)
    assert spec.head is not None and spec.head.unroll == 2
  spec = finetune.finetune_spec(
      importlib.import_module('configs.finetune.head_t5xxl').get_config(''))
  assert spec.model.init_from == 'google/t5-v1_1-xxl' and spec.mesh_shape == (1, -1)
  assert spec.head.d_model == 1024 and spec.data.task == 'ende'
  with pytest.raises(ValueError, match='task'):
    importlib.import_module('configs.finetune.head_t5xxl').get_config('task=xsum')


def test_stage_configs_chain_from_the_shipped_head():
  """The shipped head's stages 2 and 3 start from the head in the assets and keep its recipe;
  stage 3 differs by its data (every training verse's target translation) alone."""
  cont = importlib.import_module('configs.finetune.bible_head_continue').get_config()
  alldata = importlib.import_module('configs.finetune.bible_head_alldata').get_config()
  for c in (cont, alldata):
    assert c.head.init_from == 'specjax/assets/tiny_pair/head' and not c.head.freeze_trunk
    assert c.export_dir.startswith('runs/') and c.steps == 2000
  assert cont.data.train_examples == 16000 and alldata.data.train_examples == 0
  assert alldata.head.to_dict() == cont.head.to_dict() and alldata.optim == cont.optim
  smoke = importlib.import_module('configs.finetune.bible_head_alldata').get_config('smoke')
  assert smoke.export_dir == '' and smoke.head.init_from == ''
