"""pipeline/world/pictures.py: scenes rendered by several processes are the same files, in the
order asked, as those rendered here."""

from pipeline.world import pictures as module
from pipeline.world.pictures import Painter, Pictures, SceneFile
from pipeline.world.scene import Palette

PAINTER = Painter(seed=3, min_objects=1, max_objects=3, palette=Palette(), jpeg_quality=90)


def test_two_processes_render_the_same_files_in_order(monkeypatch):
    monkeypatch.setattr(module, "LEAST_SHARED", 8)
    jobs = [SceneFile(100 + i, "train", least_objects=1 + i % 2,
                      format=("png" if i % 3 else "jpeg")) for i in range(11)]
    here = list(Pictures(PAINTER, workers=1)(jobs))
    with Pictures(PAINTER, workers=2) as pictures:
        shared = list(pictures(jobs))
        assert pictures.pool is not None  # rendered by the workers, not here
    assert pictures.pool is None  # ended with the block
    assert [s.image_id for s, _, _ in shared] == [job.image_id for job in jobs]
    assert shared == here
    assert here[0][1][:3] == b"\xff\xd8\xff" and here[1][1][:4] == b"\x89PNG"
    assert all(len(scene.objects) >= 2 for (scene, _, _), job in zip(here, jobs, strict=True)
               if job.least_objects == 2)


def test_a_few_scenes_render_here():
    with Pictures(PAINTER, workers=2) as pictures:
        few = list(pictures([SceneFile(7, "val")]))
        assert pictures.pool is None
    scene, data, size = few[0]
    assert scene.image_id == 7 and scene.split == "val" and data == PAINTER(SceneFile(7, "val"))[1]
    assert size == (scene.width, scene.height)
