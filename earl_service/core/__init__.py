"""The torch-free numeric core: RotatE maths, known answers and kNResEnt in numpy, each formula written once.

The predictor, the device reader and evaluation call it; the torch paths mirror it only where autograd needs
it. Imports nothing of the package.
"""
