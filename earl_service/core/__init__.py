"""The torch-free numeric core: RotatE maths, known answers, kNResEnt and bundle decoding in numpy.

predict, edge and evaluate all call it; the torch paths mirror it only where autograd needs it.
"""
