"""Install eva_export as an ament_python package (colcon) or with pip (venv)."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "eva_export"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=["eva_export", "eva_export.*"], exclude=["tests", "tests.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", sorted(glob("launch/*.launch.py"))),
        (f"share/{PACKAGE}/config", sorted(glob("config/*.yaml") + glob("config/*.xml"))),
    ],
    package_data={"eva_export.console": ["static/*"]},
    install_requires=["setuptools"],
    extras_require={"ray": ["ray==2.60.0"]},  # eva-export batch --ray (never imported by the nodes)
    python_requires=">=3.10",
    zip_safe=True,
    maintainer="eva_export developers",
    maintainer_email="dev@eva-export.invalid",
    description="Robot demonstration capture, quality split, dataset export and upload.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "capture_node = eva_export.nodes.capture_node:main",
            "export_node = eva_export.nodes.export_node:main",
            "upload_node = eva_export.nodes.upload_node:main",
            "console_node = eva_export.nodes.console_node:main",
            "teleop_sim = eva_export.nodes.teleop_sim:main",
            "eva-export = eva_export.cli:run",
        ],
    },
)
