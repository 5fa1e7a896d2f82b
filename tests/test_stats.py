"""Statistics: streamed values equal numpy's over the whole data; every number written is finite."""

from __future__ import annotations

import numpy as np

from eva_export.formats.common import stats as S


def test_column_stats_equal_numpy_with_quantiles() -> None:
    rng = np.random.default_rng(0)
    v = rng.normal(size=(500, 3)).astype(np.float32)
    d = S.column_stats(v)
    f = v.astype(np.float64)
    assert np.allclose(d["mean"], f.mean(0)) and np.allclose(d["std"], f.std(0))
    assert d["min"] == f.min(0).tolist() and d["max"] == f.max(0).tolist() and d["count"] == [500]
    for name, q in S.QUANTILES.items():
        assert np.allclose(d[name], np.quantile(f, q, axis=0)), name


def test_rows_with_non_finite_values_are_left_out_and_counted() -> None:
    v = np.tile(np.arange(10.0)[:, None], (1, 2))
    v[3, 0] = np.nan
    v[4, 1] = np.inf
    d = S.column_stats(v)
    kept = np.delete(np.arange(10.0), [3, 4])  # a row goes in only when all its values are finite
    assert d["count"] == [8]
    assert d["mean"] == [kept.mean()] * 2 and d["min"] == [0, 0] and d["max"] == [9, 9]
    assert np.allclose(d["std"], kept.std()) and np.allclose(d["q50"], np.median(kept))
    assert S.finite_entry(d) and S.usable_entry(d)


def test_a_feature_without_a_finite_row_gets_finite_identity_stats_with_count_0() -> None:
    v = np.ones((6, 3))
    v[:, 0] = np.nan  # one element NaN in every row: no row is finite
    d = S.column_stats(v)
    assert d["count"] == [0] and S.finite_entry(d) and not S.usable_entry(d)
    assert d["mean"] == [0.0] * 3 and d["std"] == [1.0] * 3 and d["q01"] == [-1.0] * 3 and d["q99"] == [1.0] * 3
    assert set(S.STAT_KEYS) | set(S.QUANTILES) <= set(d)


def test_aggregate_pools_only_finite_entries_and_stays_finite() -> None:
    good = S.column_stats(np.arange(10.0)[:, None])
    none = S.column_stats(np.full((5, 1), np.nan))  # count 0: adds nothing, not even to min/max
    poisoned = {**good, "mean": [float("nan")]}  # e.g. an old writer's NaN statistics
    agg = S.aggregate([{"x": good}, {"x": none}, {"x": poisoned}])["x"]
    assert agg["count"] == [10] and agg["min"] == [0.0] and agg["max"] == [9.0] and agg["mean"] == [4.5]
    only_nan = S.aggregate([{"x": none}])["x"]
    assert only_nan["count"] == [0] and S.finite_entry(only_nan)


def test_the_three_poolers_agree_and_are_finite() -> None:
    from eva_export.export.assemble import aggregate_stream
    from eva_export.formats.lerobot_v3.tables import _aggregate_matrices

    parts = [np.arange(12.0).reshape(6, 2), np.full((4, 2), np.nan), np.arange(8.0).reshape(4, 2) + 100]
    parts[0][2, 1] = np.inf
    per = [{"x": S.column_stats(p)} for p in parts]
    a, b = S.aggregate(per)["x"], aggregate_stream(per)["x"]
    mats = {k: np.stack([np.asarray(p["x"][k], dtype=np.float64) for p in per]) for k in per[0]["x"]}
    c = _aggregate_matrices(mats)
    assert c is not None
    for got in (b, c):
        assert got["count"] == a["count"] == [9]
        for k in ("mean", "std", "min", "max", *S.QUANTILES):
            assert np.allclose(got[k], a[k]), k
            assert np.isfinite(np.asarray(got[k])).all()
    assert _aggregate_matrices({k: v[1:2] for k, v in mats.items()})["count"] == [0]  # type: ignore[index]


def test_aggregate_matches_stats_of_concatenation() -> None:
    rng = np.random.default_rng(1)
    parts = [rng.normal(loc=i, size=(n, 2)) for i, n in enumerate((30, 70, 5))]
    agg = S.aggregate({"x": S.column_stats(p)} for p in parts)["x"]
    allv = np.concatenate(parts)
    assert agg["count"] == [105]
    assert np.allclose(agg["mean"], allv.mean(0)) and np.allclose(agg["std"], allv.std(0))
    assert agg["min"] == allv.min(0).tolist() and agg["max"] == allv.max(0).tolist()
    assert "q01" in agg and "q99" in agg  # count-weighted, like LeRobot


def test_image_stats_per_channel_in_unit_range() -> None:
    im = S.ImageStats(every_nth_frame=1, pixel_stride=1)
    for level in (0, 51, 255):
        frame = np.zeros((4, 4, 3), np.uint8)
        frame[..., 0] = level
        frame[..., 2] = 255
        im.add(frame)
    d = im.to_dict()
    assert np.asarray(d["mean"]).shape == (3, 1, 1) and d["count"] == [3]
    assert np.isclose(d["mean"][0][0][0], (0 + 51 + 255) / 3 / 255)
    assert d["max"][2][0][0] == 1.0 and d["min"][1][0][0] == 0.0
    assert d["q50"][0][0][0] == 51 / 255 and d["q99"][0][0][0] == 1.0


def _finite_per_stat(entry: object) -> bool:
    """finite_entry's definition: each stat converted to float64 on its own."""
    if not isinstance(entry, dict):
        return False
    try:
        return all(bool(np.isfinite(np.asarray(v, dtype=np.float64)).all()) for v in entry.values())
    except (TypeError, ValueError):
        return False


def test_finite_entry_answers_as_each_stat_checked_on_its_own() -> None:
    """The one-conversion check gives the per-stat answer for plain, camera-shaped, ragged,
    mixed, non-numeric and non-finite entries alike."""
    cam = [[[0.5]], [[0.25]], [[0.75]]]
    entries: list[object] = [
        {"min": [0.0, 1.0], "max": [2.0, 3.0], "count": [4]},
        {"min": cam, "max": cam, "mean": cam, "count": [10]},
        {"min": cam, "max": [[[float("nan")]], [[0.1]], [[0.2]]], "count": [10]},
        {"min": [0.0, float("inf")], "count": [4]},
        {"min": [0.0, None], "count": [4]},
        {"min": ["1.5", 2.0], "count": [4]},
        {"min": ["x"], "count": [4]},
        {"min": [[1.0], [2.0, 3.0]], "count": [4]},
        {"min": [1.0, [2.0]], "count": [4]},
        {"min": [[1.0, 2.0]], "max": [[[1.0]]], "count": [4]},
        {"min": [], "count": []},
        {"min": 1.0, "count": [4]},
        {"min": {"a": 1}, "count": [4]},
        {"min": [True, False], "count": [1]},
        {},
        [1.0],
        None,
    ]
    for entry in entries:
        assert S.finite_entry(entry) is _finite_per_stat(entry), entry
    assert S.entry_count({"count": [7]}) == 7.0 and S.entry_count({"count": [[3]]}) == 3.0
    assert S.entry_count({"count": ["x"]}) == 0.0 and S.entry_count({"count": []}) == 0.0


def test_assembly_usable_check_answers_as_usable_entry() -> None:
    """Assembly's one-conversion check of an entry gives usable_entry's answer (or its error)."""
    base: dict[str, object] = {"min": [0.0, 1.0], "max": [2.0, 3.0], "mean": [1.0, 2.0], "std": [0.5, 0.5]}
    counts: list[object] = [[4], [0], [-1], [2.5], [float("nan")], [True], [[3]], "x", [10**400], [2**60], []]
    variants: list[dict[str, object]] = [{}, {"mean": [float("inf"), 1.0]}, {"extra": "x"}, {"extra": [1.0]},
                                         {q: [0.0, 1.0] for q in S.QUANTILES}, {"q01": [0.0, 1.0]},
                                         {"std": [[0.5], [0.5]]}, {"min": "1.5"}, {"min": [10**400, 1.0]},
                                         {"max": [float("nan"), 1.0], "min": [10**400, 1.0]}]
    for count in counts:
        for variant in variants:
            for count_first in (False, True):
                entry = {**base, **variant, "count": count}
                if count_first:
                    entry = {"count": count, **{k: v for k, v in entry.items() if k != "count"}}
                outcomes = []
                for check in (S.usable_entry, lambda e: S.usable_stacked(e)[0]):
                    try:
                        outcomes.append(check(entry))
                    except OverflowError:
                        outcomes.append("overflow")
                assert outcomes[0] == outcomes[1], entry
