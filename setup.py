"""The one compiled part: the audit trail's hot hooks (``broker/audit/_hooks.c``).

Optional: without a C compiler the install goes on and ``broker.audit.hooks`` uses the
Python version of the same class."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("broker.audit._hooks", ["broker/audit/_hooks.c"],
                             optional=True, extra_compile_args=["-O2"])])
