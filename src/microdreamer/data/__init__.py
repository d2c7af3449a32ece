"""Input data: images for image-to-3D (:mod:`.image`), posed ``transforms.json`` datasets (:mod:`.dataset`)
and ground-truth views rendered from a mesh (:mod:`.views`)."""

from microdreamer.data.dataset import Dataset, Normalization, load_dataset, save_dataset
from microdreamer.data.views import render_views, view_angles

__all__ = ["Dataset", "Normalization", "load_dataset", "render_views", "save_dataset", "view_angles"]
