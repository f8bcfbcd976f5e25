"""Two editions (curriculum §2, §5): where the tests run, and what a hardening test skips.

A feature's tests run at the stage that introduced it and at the newest stage, in both
editions; a test marked `hardening` runs on the hardened edition only.
"""

from types import SimpleNamespace

import conftest
from helpers import HARDENED, all_stages, every_stage, first_and_newest, stages_from


def test_a_feature_runs_where_it_was_added_and_at_the_newest_stage_in_both_editions():
    newest = all_stages()[-1]
    assert stages_from("s03") == ["s03_session_store", newest,
                                  HARDENED + "s03_session_store", HARDENED + newest]
    assert stages_from(newest[:3]) == [newest, HARDENED + newest]
    assert first_and_newest(stages_from("s03")) == ["s03_session_store", HARDENED + newest]
    assert every_stage() == all_stages() + [HARDENED + s for s in all_stages()]


class Item(SimpleNamespace):
    def get_closest_marker(self, name):
        return name if name in self.markers else None


def test_a_hardening_test_leaves_out_its_teaching_cases():
    deselected = []
    config = SimpleNamespace(hook=SimpleNamespace(
        pytest_deselected=lambda items: deselected.extend(items)))
    items = [Item(markers={"hardening"}, callspec=SimpleNamespace(params={"stage": stage}))
             for stage in stages_from("s09")]
    behaviour = Item(markers=set(), callspec=SimpleNamespace(params={"stage": "s09_permission_"
                                                                              "system"}))
    unparametrized = Item(markers={"hardening"})
    collected = items + [behaviour, unparametrized]
    conftest.pytest_collection_modifyitems(config, collected)
    assert [item.callspec.params["stage"] for item in deselected] == [
        stage for stage in stages_from("s09") if not stage.startswith(HARDENED)]
    assert collected == items[2:] + [behaviour, unparametrized]
